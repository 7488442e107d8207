"""Findings of a second admin REST API review: each test pins a behaviour where the admin API
departed from Apache Pulsar's (or from itself); each failed on the code as reviewed."""

from __future__ import annotations

import asyncio

P = "/admin/v2/persistent/public/default"
T = "persistent://public/default/"


def held_close(topic) -> asyncio.Event:
    """Hold the close of `topic` (its unload) until the returned event is set."""
    gate = asyncio.Event()
    close = topic.buffer.close

    async def held() -> None:
        await gate.wait()
        await close()
    topic.buffer.close = held
    return gate


async def unloading(service, name: str) -> tuple[asyncio.Task, asyncio.Event]:
    """An unload of `name` started and held half-way (the topic closed, still loaded)."""
    topic = service.topics[name]
    gate = held_close(topic)
    unload = asyncio.create_task(service.unload_topic(name))
    while not topic.closed:
        await asyncio.sleep(0)
    return unload, gate


# --- partitions being unloaded --------------------------------------------------------------
# A request on a partitioned topic took each partition as loaded, the closed one of an unload
# under way included: the work was done on (or refused by) the topic being dropped, not on the
# partition loaded again, as a request on the topic itself does (get_open_topic).

async def test_compaction_of_a_partitioned_topic_reaches_a_partition_being_unloaded(api, client, service):
    """PUT compaction answered 204 while the compaction started on the closing partition was
    dropped with it: the partition loaded again never ran it (NOT_RUN)."""
    assert (await api.put(f"{P}/pc/partitions", 2)).status == 204
    producer = await client.create_producer(T + "pc-partition-0")
    for i in range(3):
        await producer.send(b"m%d" % i, key="k")
    await producer.close()
    unload, gate = await unloading(service, T + "pc-partition-0")
    trigger = asyncio.create_task(api.put(f"{P}/pc/compaction"))
    await asyncio.sleep(0.1)
    gate.set()
    await unload
    assert (await trigger).status == 204
    await service.topics[T + "pc-partition-0"].compaction.wait()
    assert (await api.get(f"{P}/pc-partition-0/compaction")).body["status"] == "SUCCESS"


async def test_added_partitions_get_the_subscriptions_though_a_partition_is_being_unloaded(api, service):
    """POST partitions copies partition 0's subscriptions to every partition: one being unloaded
    refused it (503, closed) after the count was raised, leaving the added partition without them."""
    assert (await api.put(f"{P}/pu/partitions", 2)).status == 204
    assert (await api.put(f"{P}/pu/subscription/s", {"ledgerId": -1, "entryId": -1})).status == 204
    await service.topics[T + "pu-partition-1"].unsubscribe("s")
    unload, gate = await unloading(service, T + "pu-partition-1")
    update = asyncio.create_task(api.post(f"{P}/pu/partitions", 3))
    await asyncio.sleep(0.1)
    gate.set()
    await unload
    assert (await update).status == 204
    for index in range(3):
        assert (await api.get(f"{P}/pu-partition-{index}/subscriptions")).body == ["s"]
