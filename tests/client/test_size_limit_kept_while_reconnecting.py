"""A producer keeps the broker's max_message_size while it reconnects (as the C++ client's
ClientConnection::getMaxMessageSize keeps the last one announced): a send meanwhile is refused
with MessageTooBigError, or chunked by that limit. It used to be checked and chunked by the
5 MB default, and the oversized frame made the broker close every reconnect, for good."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.client import Client
from pyengine.client.errors import MessageTooBigError

from .test_chunking import LIMIT, small_broker  # noqa: F401  (fixture)

TOPIC = "persistent://public/default/size-limit-reconnecting"


@pytest.mark.parametrize("chunking", [False, True])
async def test_a_send_while_reconnecting_obeys_the_last_known_limit(small_broker, chunking):
    async with Client(small_broker.url, operation_timeout_seconds=10) as client:
        producer = await client.create_producer(TOPIC, chunking_enabled=chunking, send_timeout_ms=0)
        await producer.send(b"small")
        await small_broker.stop()                         # the producer starts reconnecting
        await asyncio.sleep(0.2)
        big = b"x" * (3 * LIMIT)
        if not chunking:
            with pytest.raises(MessageTooBigError):
                producer.send_async(big)
            await small_broker.start()
            return
        sent = producer.send_async(big)
        await small_broker.start()                        # the same port
        await asyncio.wait_for(sent, 15)
        consumer = await client.subscribe(TOPIC, "s", initial_position="earliest")
        assert [(await consumer.receive(5)).data for _ in range(2)] == [b"small", big]
