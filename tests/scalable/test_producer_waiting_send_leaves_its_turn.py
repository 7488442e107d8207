"""ScalableProducer: a send that ends while it waits for its first turn (cancelled, timed out)
leaves the key's queue. Before, only the caller's variable held a turn, and it got it only once
the wait returned: a send ending inside that wait left its turn first in the key's queue for
good, and every later send of the key waited behind it until its operation timeout — with no
segment draining, and the periodic re-pump could not help (it only wakes the key's first turn:
the abandoned one)."""

from __future__ import annotations

import asyncio

import pytest

import pyengine.client.scalable as scalable_client
from tests.scalable.test_producer_key_order_across_splits import T, child_of, hold_split, read_in_lineage_order


@pytest.fixture(autouse=True)
def no_repump(monkeypatch):
    """The safety net off: a missed wake-up shows as a send that never goes."""
    monkeypatch.setattr(scalable_client, "REPUMP_S", 1000)


async def until(condition, timeout: float = 5) -> None:
    async def wait() -> None:
        while not condition():
            await asyncio.sleep(0.005)
    await asyncio.wait_for(wait(), timeout)


async def test_a_send_cancelled_in_its_first_wait_does_not_hold_its_key_back(client, service):
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    producer = await client.create_producer(T)
    await producer.send(b"0", key="k")
    split, publish = await hold_split(scalable, 0)
    refused = asyncio.create_task(producer.send(b"1", key="k"))
    await until(lambda: len(producer._waiting.get("k", [])) == 1)     # refused: the parent drains
    cancelled = asyncio.create_task(producer.send(b"2", key="k"))
    await until(lambda: len(producer._waiting["k"]) == 2)             # queued behind it, waiting
    cancelled.cancel()
    later = asyncio.create_task(producer.send(b"3", key="k"))
    await asyncio.sleep(0)
    publish.set()
    await split
    assert (await asyncio.wait_for(refused, 5))[0] == child_of("k")
    assert (await asyncio.wait_for(later, 5))[0] == child_of("k")
    assert cancelled.cancelled()
    assert [data for key, data in await read_in_lineage_order(client, producer) if key == "k"] == ["0", "1", "3"]
    assert not producer._waiting and not producer._draining
    await producer.close()
