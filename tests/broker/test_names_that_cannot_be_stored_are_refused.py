"""Names that are keys of the broker's storage (LMDB keys, at most 511 bytes) are refused when
too long, with a clear error, before anything is written. Found by an audit: a topic or
subscription name over the limit failed the group commit it was written in ("MDB_BAD_VALSIZE"),
with the other clients' writes that shared it."""

from __future__ import annotations

import pytest

from pyengine.broker import Broker
from pyengine.errors import InvalidSubscriptionNameError, InvalidTopicNameError, NotAllowedError
from pyengine.naming import MAX_NAME_BYTES, TopicName

T = "persistent://public/default/ok"


def test_topic_names_are_counted_in_bytes():
    fits = "persistent://public/default/" + "t" * (MAX_NAME_BYTES - len("persistent://public/default/"))
    assert str(TopicName.parse(fits)) == fits
    with pytest.raises(InvalidTopicNameError, match="bytes"):
        TopicName.parse(fits + "t")
    with pytest.raises(InvalidTopicNameError, match="bytes"):
        TopicName.parse("漢" * 130)                       # a short name, 390 bytes in full
    with pytest.raises(InvalidTopicNameError, match="UTF-8"):
        TopicName.parse("bad\ud800")


async def test_long_names_are_refused_and_the_others_are_served(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, deduplication_enabled=True) as broker:
        producer = await broker.create_producer(T)
        with pytest.raises(InvalidTopicNameError):
            await broker.create_producer("persistent://public/default/" + "t" * 600)
        with pytest.raises(InvalidSubscriptionNameError, match="bytes"):
            await broker.subscribe(T, "s" * (MAX_NAME_BYTES + 1))
        with pytest.raises(NotAllowedError, match="bytes"):
            await broker.create_producer(T, producer_name="p" * (MAX_NAME_BYTES + 1))
        consumer = await broker.subscribe(T, "s" * MAX_NAME_BYTES, initial_position="earliest")
        named = await broker.create_producer(T, producer_name="p" * MAX_NAME_BYTES)
        await named.send(b"named")                           # its de-duplication record fits
        await producer.send(b"plain")
        received = [(await consumer.receive(timeout=5)).data for _ in range(2)]
        assert received == [b"named", b"plain"]
