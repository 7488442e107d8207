"""ScalableProducer: a send refused by a sealed segment whose new layout never comes fails
with TimeoutError after the producer's send timeout (`send_timeout_ms`, as the README says and
as a Pulsar producer's pending send fails; 0: no limit), not the client's operation timeout,
and the key's later sends are not stuck."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.scalable.test_producer_key_order_across_splits import T, child_of, hold_split, read_in_lineage_order


@pytest.fixture
def operation_timeout() -> float:
    return 60            # far from the 1 s send timeout, and from a loaded machine's stalls


async def test_a_refused_send_times_out_without_a_new_layout_after_its_send_timeout(client, service):
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    producer = await client.create_producer(T, send_timeout_ms=1000)
    await producer.send(b"0", key="k")
    split, publish = await hold_split(scalable, 0)
    started = time.monotonic()
    refused = asyncio.create_task(producer.send(b"1", key="k"))
    await asyncio.sleep(0.5)
    later = asyncio.create_task(producer.send(b"2", key="k"))     # waits behind it (its own timeout)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(refused, 30)                        # well before the operation timeout
    assert time.monotonic() - started < 30
    publish.set()
    await split
    assert (await asyncio.wait_for(later, 5))[0] == child_of("k")
    assert [data for key, data in await read_in_lineage_order(client, producer) if key == "k"] == ["0", "2"]
    await producer.close()


@pytest.mark.parametrize("operation_timeout", [0.5])
async def test_with_no_send_timeout_a_refused_send_waits_past_the_operation_timeout(client, service):
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    producer = await client.create_producer(T, send_timeout_ms=0)
    await producer.send(b"0", key="k")
    split, publish = await hold_split(scalable, 0)
    refused = asyncio.create_task(producer.send(b"1", key="k"))
    await asyncio.sleep(1.5)                                        # three operation timeouts
    assert not refused.done()
    publish.set()
    await split
    assert (await asyncio.wait_for(refused, 5))[0] == child_of("k")
    assert [data for key, data in await read_in_lineage_order(client, producer) if key == "k"] == ["0", "1"]
    await producer.close()
