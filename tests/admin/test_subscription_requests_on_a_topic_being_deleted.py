"""Subscription requests on a partitioned topic while one of its partitions is being deleted
(closed, still loaded until its deletion ends): that partition is passed over as a deleted one
(the requests on a plain topic being deleted answer 404: test_topic_lifecycle_under_concurrency)."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.broker.topic import Topic

T = "/admin/v2/persistent/public/default/deleting"
NAME = "persistent://public/default/deleting"
MESSAGE_ID = {"ledgerId": -1, "entryId": -1}


@pytest.mark.parametrize("path", ["/subscription/s/resetcursor/0", "/subscription/s/skip_all"])
async def test_a_partition_being_deleted_is_passed_over_as_a_deleted_one(api, service, client, monkeypatch, path):
    """The partitioned topic's deletion is at partition 0 (closed, not deleted yet): a request
    on the partitioned topic applies to the partitions left, as it would once partition 0 is
    gone (a reset by time answered 404 for the closed partition, skip_all 204)."""
    assert (await api.put(T + "/partitions", 2)).status == 204
    assert (await api.put(T + "/subscription/s", MESSAGE_ID)).status == 204
    producer = await client.create_producer(NAME + "-partition-1")
    await producer.send(b"x")
    await producer.close()
    reset = path.endswith("/0")
    if reset:                                   # reset to the start: the message is back
        assert (await api.post(T + "/subscription/s/skip_all")).status == 204
    started, release = asyncio.Event(), asyncio.Event()
    delete_topic = Topic.delete

    async def held_delete(self, also=()):
        if self.name.endswith("-partition-0"):
            await self.close()
            started.set()
            await release.wait()
        await delete_topic(self, also)

    monkeypatch.setattr(Topic, "delete", held_delete)
    delete = asyncio.ensure_future(api.delete(T + "/partitions?force=true"))
    await started.wait()
    subscription = service.topics[NAME + "-partition-1"].subscriptions["s"]
    assert subscription.backlog() == (0 if reset else 1)
    reply = await api.post(T + path)
    backlog = subscription.backlog()
    release.set()
    assert (await delete).status == 204
    assert reply.status == 204, reply.body
    assert backlog == (1 if reset else 0)
