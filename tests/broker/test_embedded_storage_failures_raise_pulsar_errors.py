"""A storage failure under an embedded subscribe, seek or unsubscribe is raised as the Pulsar
error the wire answers for it (PersistenceError, through `to_pulsar_error`), as a send's is:
code written against `pyengine.client` catches the same class. They surfaced as the raw
`pyengine.storage.StorageError`, which is no PulsarError."""

from __future__ import annotations

import pytest

from pyengine.broker import Broker
from pyengine.broker.embedded import MessageId
from pyengine.errors import PersistenceError
from pyengine.storage import StorageError
from tests.broker.helpers import drain
from tests.broker.test_unsubscribe_whose_deletion_failed import fail_the_deletion_of
from tests.storage.test_repeated_ack_after_a_failed_save import fail_next_cursor_save

TOPIC = "persistent://public/default/storage-fails"


def _raised_as_pulsar_error(info: pytest.ExceptionInfo) -> None:
    assert isinstance(info.value, PersistenceError), type(info.value)
    assert "injected" in str(info.value)
    assert isinstance(info.value.__cause__, StorageError)     # the storage failure stays readable


async def test_a_subscribe_whose_cursor_is_not_saved_raises_persistence_error(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(TOPIC)
        await producer.send(b"m0")
        fail_next_cursor_save(broker.service.topics[TOPIC].ledger.env)
        with pytest.raises(Exception) as info:
            await broker.subscribe(TOPIC, "s", initial_position="earliest")
        _raised_as_pulsar_error(info)
        consumer = await broker.subscribe(TOPIC, "s", initial_position="earliest")     # a retry works
        assert [m.data for m in await drain(consumer)] == [b"m0"]


async def test_a_seek_whose_save_failed_raises_persistence_error(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(TOPIC)
        for i in range(3):
            await producer.send(b"m%d" % i)
        consumer = await broker.subscribe(TOPIC, "s", initial_position="earliest")
        assert len(await drain(consumer)) == 3
        fail_next_cursor_save(broker.service.topics[TOPIC].subscriptions["s"].cursor.ledger.env)
        with pytest.raises(Exception) as info:
            await consumer.seek(MessageId.earliest)
        _raised_as_pulsar_error(info)
        assert [m.data for m in await drain(consumer)] == [b"m0", b"m1", b"m2"]


async def test_an_unsubscribe_whose_deletion_failed_raises_persistence_error(tmp_path):
    async with Broker.embedded(tmp_path, num_coordinators=1) as broker:
        producer = await broker.create_producer(TOPIC)
        await producer.send(b"m0")
        consumer = await broker.subscribe(TOPIC, "s", initial_position="earliest")
        topic = broker.service.topics[TOPIC]
        fail_the_deletion_of(topic, "s")
        with pytest.raises(Exception) as info:
            await consumer.unsubscribe()
        _raised_as_pulsar_error(info)
        assert "s" in topic.subscriptions                   # still stored, its backlog kept
