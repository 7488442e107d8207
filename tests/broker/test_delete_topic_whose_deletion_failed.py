"""Deleting a topic closes it, then deletes everything it keeps in one LMDB write. When that
write fails (a full map, a failing disk) the deletion fails and the topic is still stored: a
restart serves it. It used to stay loaded closed all the same, so every later send or
subscribe on it was refused ("topic ... is closed") until the broker restarted. Now its next
use loads it again, as stored."""

import pytest

from pyengine.broker import Broker
from pyengine.storage import StorageError
from tests.storage.helpers import fail_next_save_after_close

TOPIC = "persistent://public/default/not-deleted"


def fail_the_deletion_of(topic) -> list:
    """The first group commit after the topic closed (its deletion) fails as a whole."""
    return fail_next_save_after_close(topic, topic.ledger.env)


async def received(broker, subscription: str) -> list[bytes]:
    consumer = await broker.subscribe(TOPIC, subscription, initial_position="earliest")
    got = []
    try:
        while True:
            got.append((await consumer.receive(timeout=0.3)).data)
    except TimeoutError:
        pass
    await consumer.close()
    return got


async def test_a_topic_whose_deletion_failed_is_served_again(tmp_path):
    async with Broker.embedded(tmp_path / "data", num_coordinators=1) as broker:
        producer = await broker.create_producer(TOPIC)
        await producer.send(b"m0")
        await producer.close()
        topic = await broker.service.get_topic(TOPIC, create=False)
        failed = fail_the_deletion_of(topic)
        with pytest.raises(StorageError, match="injected"):
            await broker.service.delete_topic(TOPIC)
        assert failed
        producer = await broker.create_producer(TOPIC)      # was refused: the topic stayed closed
        await producer.send(b"m1")
        await producer.close()
        assert await received(broker, "S") == [b"m0", b"m1"]
    async with Broker.embedded(tmp_path / "data", num_coordinators=1) as broker:
        assert await received(broker, "S2") == [b"m0", b"m1"]


async def test_a_topic_whose_close_failed_in_its_deletion_is_served_again(tmp_path, monkeypatch):
    """The same when the close before the deletion fails (a subscription's state not saved):
    the topic was kept loaded, closed, refusing every send until a restart."""
    from pyengine.broker.topic import Topic

    close = Topic._close

    async def failing_close(topic):
        await close(topic)
        raise StorageError("injected close failure")

    async with Broker.embedded(tmp_path / "data", num_coordinators=1) as broker:
        producer = await broker.create_producer(TOPIC)
        await producer.send(b"m0")
        await producer.close()
        topic = await broker.service.get_topic(TOPIC, create=False)
        monkeypatch.setattr(topic, "_closing", type(topic._closing)(lambda: failing_close(topic)))
        with pytest.raises(StorageError, match="injected"):
            await broker.service.delete_topic(TOPIC)
        assert broker.service.topics.get(TOPIC) is not topic
        producer = await broker.create_producer(TOPIC)
        await producer.send(b"m1")
        await producer.close()
        assert await received(broker, "S") == [b"m0", b"m1"]
