"""Review findings on the admin API's view of topics being unloaded."""

from __future__ import annotations

import asyncio

P = "/admin/v2/persistent/public/default"
PT = "persistent://public/default/pt"


def hold_close(topic) -> tuple[asyncio.Event, asyncio.Event]:
    """Hold `topic`'s close (closed, refusing everything, not forgotten yet) until `release`."""
    closing, release = asyncio.Event(), asyncio.Event()
    close = topic.compaction.close

    async def held():
        closing.set()
        await release.wait()
        await close()

    topic.compaction.close = held
    return closing, release


async def test_a_partition_being_unloaded_is_not_passed_over_by_a_subscription_request(api, service, client):
    """A partition closed by its unload (a namespace unload, say) was taken for one being
    deleted and passed over: skip_all on the partitioned topic answered 204 while that
    partition's backlog stayed, there once it was loaded again. The request now waits for the
    unload and acts on the partition loaded again."""
    assert (await api.put(f"{P}/pt/partitions", 2)).status == 204
    assert (await api.put(f"{P}/pt/subscription/s", {"ledgerId": -1, "entryId": -1})).status == 204
    for index in range(2):
        producer = await client.create_producer(f"{PT}-partition-{index}")
        await producer.send(b"m")
        await producer.close()
    first = f"{PT}-partition-0"
    closing, release = hold_close(service.topics[first])
    unloading = asyncio.ensure_future(service.unload_topic(first))
    await closing.wait()
    skipping = asyncio.ensure_future(api.post(f"{P}/pt/subscription/s/skip_all"))
    await asyncio.sleep(0.1)
    release.set()
    assert await unloading
    reply = await skipping
    assert reply.status == 204, reply.body
    for index in range(2):
        topic = await service.get_topic(f"{PT}-partition-{index}", create=False)
        assert topic.subscriptions["s"].backlog() == 0, index


async def test_a_topic_being_unloaded_is_not_answered_as_one_being_deleted(api, service, client):
    """The same on a non-partitioned topic: a request meeting its unload was 404 ("being
    deleted") for a topic that exists. It waits for the unload and is done on the topic
    loaded again."""
    name = "persistent://public/default/plain"
    producer = await client.create_producer(name)
    await producer.send(b"m")
    await producer.close()
    assert (await api.put(f"{P}/plain/subscription/s", {"ledgerId": -1, "entryId": -1})).status == 204
    closing, release = hold_close(service.topics[name])
    unloading = asyncio.ensure_future(service.unload_topic(name))
    await closing.wait()
    skipping = asyncio.ensure_future(api.post(f"{P}/plain/subscription/s/skip_all"))
    stats = asyncio.ensure_future(api.get(f"{P}/plain/stats"))
    await asyncio.sleep(0.1)
    release.set()
    assert await unloading
    assert (await skipping).status == 204
    assert (await stats).status == 200
    assert (await service.get_topic(name, create=False)).subscriptions["s"].backlog() == 0
