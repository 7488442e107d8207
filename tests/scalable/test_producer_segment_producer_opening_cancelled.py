"""ScalableProducer: the first send to a segment opens the segment's producer, and the sends
arriving meanwhile wait for that opening. The opening used to be the first sender's: cancelled
(a timeout, a task cancelled) while it opened, it dropped the producer it had just opened —
never stored, never closed, left open on the broker and in the client — and the other sends
waiting for it failed with CancelledError though nobody cancelled them."""

from __future__ import annotations

import asyncio

from tests.scalable.test_producer_key_order_across_splits import T, read_in_lineage_order


async def broker_producers(service, producer, segment_id: int) -> int:
    name = producer.watch.layout.segment(segment_id).topic_name(producer.watch.topic_name)
    return len((await service.get_topic(str(name), create=False)).producers)


async def opening_held(client, service, cancel_first):
    """Sends "1" then "2" of one key to a segment whose producer is not open yet; `cancel_first`
    (given the creation step and the first send) cancels "1" while its producer opens. Returns
    the scalable producer, the segment producers created and the sends."""
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    producer = await client.create_producer(T)
    real_create = producer._client.create_producer
    created = []
    sends: list[asyncio.Task] = []

    async def create(*args, **kwargs):
        await cancel_first("before", sends[0])
        made = await real_create(*args, **kwargs)
        created.append(made)
        await cancel_first("after", sends[0])
        return made
    producer._client.create_producer = create
    try:
        sends.append(asyncio.create_task(producer.send(b"1", key="k")))
        sends.append(asyncio.create_task(producer.send(b"2", key="k")))    # waits for the same opening
        await asyncio.wait(sends, timeout=5)
    finally:
        producer._client.create_producer = real_create
    return producer, created, sends


async def check_no_producer_left_behind(client, service, producer, created, sends) -> None:
    first, second = sends
    assert first.cancelled()
    assert len(created) == 1
    assert await broker_producers(service, producer, 0) == 1
    assert second.result()[0] == 0                # not failed by the first one's cancellation
    assert (await producer.send(b"3", key="k"))[0] == 0     # with the producer that was opened
    assert len(created) == 1 and producer._producers[0] is created[0]
    assert [data for key, data in await read_in_lineage_order(client, producer) if key == "k"] == ["2", "3"]
    await producer.close()
    assert await broker_producers(service, producer, 0) == 0
    assert client._core.open_objects == []


async def test_a_first_send_cancelled_as_its_segment_producer_opens_leaves_it_to_the_next(client, service):
    async def cancel_first(step, first):
        if step == "after":                       # opened, not handed to its sender yet
            first.cancel()
    await check_no_producer_left_behind(client, service, *await opening_held(client, service, cancel_first))


async def test_a_first_send_cancelled_while_its_segment_producer_opens_leaves_it_to_the_next(client, service):
    async def cancel_first(step, first):
        if step == "before":                      # the opening under way
            first.cancel()
            await asyncio.sleep(0)
    await check_no_producer_left_behind(client, service, *await opening_held(client, service, cancel_first))


async def test_a_producer_closed_while_a_segment_producer_opens_closes_it(client, service):
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    producer = await client.create_producer(T)
    real_create = producer._client.create_producer
    opened, release = asyncio.Event(), asyncio.Event()

    async def create(*args, **kwargs):
        made = await real_create(*args, **kwargs)
        opened.set()
        await release.wait()
        return made
    producer._client.create_producer = create
    send = asyncio.create_task(producer.send(b"1", key="k"))
    await opened.wait()
    send.cancel()                                 # as its segment's producer opens
    closing = asyncio.create_task(producer.close())
    await asyncio.sleep(0.05)
    release.set()
    await asyncio.wait_for(closing, 5)
    assert send.cancelled()
    assert await broker_producers(service, producer, 0) == 0
    assert client._core.open_objects == []
