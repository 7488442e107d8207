"""A topic's close runs once and to its end: a caller cancelled meanwhile (a timed-out unload
or deletion) left the topic half-closed, refusing everything yet with its ledger open and its
subscriptions dispatching, and a later close (a deletion's) returned at once; a part failing to
close left the parts after it open."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.broker import Broker

T = "persistent://public/default/closing"


async def test_a_cancelled_close_still_closes_and_a_later_close_waits_for_it(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        await producer.send(b"m")
        await broker.subscribe(T, "s", initial_position="earliest")
        topic = broker.service.topics[T]
        closing = asyncio.ensure_future(topic.close())
        await asyncio.sleep(0)                          # under way, at its first await
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing
        await asyncio.wait_for(topic.close(), 5)        # waits for the same close, to its end
        assert topic.ledger._closed
        assert all(subscription.dispatcher._closed for subscription in topic.subscriptions.values())


async def test_a_part_failing_to_close_leaves_the_others_closed(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        await broker.subscribe(T, "s", initial_position="earliest")
        topic = broker.service.topics[T]
        subscription = topic.subscriptions["s"]
        close = subscription.close

        async def failing() -> None:
            await close()
            raise RuntimeError("the subscription failed to close")
        subscription.close = failing
        with pytest.raises(RuntimeError, match="failed to close"):
            await topic.close()
        assert topic.ledger._closed
        with pytest.raises(RuntimeError, match="failed to close"):
            await topic.close()                         # the same outcome, not a silent return
