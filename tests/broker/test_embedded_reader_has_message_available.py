"""The embedded reader's has_message_available after a seek by publish time, and at
MessageId.latest start-inclusive, as pyengine.client's and the C++ client's. Found by an
audit (of the network client, which had the same two faults): after a seek past the last
message it answered True and read_next waited for nothing; a latest start-inclusive reader
never read the last message."""

from __future__ import annotations

import time

import pytest

from pyengine.broker import Broker
from pyengine.client import MessageId

T = "persistent://public/default/embedded-reader-available"


async def test_after_a_seek_by_time(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        first_time = int(time.time() * 1000)
        for i in range(3):
            await producer.send(b"%d" % i)
        reader = await broker.create_reader(T, MessageId.earliest)
        await reader.seek(int(time.time() * 1000) + 3_600_000)         # past every message
        assert not await reader.has_message_available()
        await producer.send(b"later")
        assert await reader.has_message_available()
        await reader.seek(first_time)                                    # before every message
        assert await reader.has_message_available()
        assert (await reader.receive(timeout=5)).data == b"0"


async def test_at_latest_start_inclusive(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        empty = await broker.create_reader(T, MessageId.latest, start_message_id_inclusive=True)
        assert not await empty.has_message_available()
        producer = await broker.create_producer(T)
        for i in range(3):
            await producer.send(b"%d" % i)
        reader = await broker.create_reader(T, MessageId.latest, start_message_id_inclusive=True)
        assert await reader.has_message_available()
        assert (await reader.receive(timeout=5)).data == b"2"
        assert not await reader.has_message_available()
        exclusive = await broker.create_reader(T, MessageId.latest)
        assert not await exclusive.has_message_available()
        with pytest.raises(TimeoutError):
            await exclusive.receive(timeout=0.2)
