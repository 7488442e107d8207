"""Subscription requests that run while their topic is deleted (closed, still loaded until its
deletion ends) answer 404, as the topic's other requests do then (its lastMessageId, skipping
some messages, a reset by time): skip_all, the expiries, a reset to a message id and the
subscription's deletion answered 204 for what the closed topic did not do (a deletion that
fails then leaves the topic, and its subscription, as they were)."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.broker.topic import Topic

T = "/admin/v2/persistent/public/default/deleting"
NAME = "persistent://public/default/deleting"
MESSAGE_ID = {"ledgerId": -1, "entryId": -1}


@pytest.mark.parametrize("method,path,body", [
    ("POST", "/subscription/s/skip_all", None),
    ("POST", "/subscription/s/expireMessages/0", None),
    ("POST", "/subscription/s/expireMessages", {"ledgerId": 0, "entryId": 0}),
    ("POST", "/all_subscription/expireMessages/0", None),
    ("POST", "/subscription/s/resetcursor", MESSAGE_ID),
    ("DELETE", "/subscription/s", None),
    ("GET", "/subscriptions", None),
])
async def test_subscription_requests_on_a_topic_being_deleted_are_404(api, service, client, monkeypatch,
                                                                       method, path, body):
    assert (await api.put(T)).status == 204
    assert (await api.put(T + "/subscription/s", MESSAGE_ID)).status == 204
    producer = await client.create_producer(NAME)
    await producer.send(b"x")
    await producer.close()
    started, release = asyncio.Event(), asyncio.Event()
    delete_topic = Topic.delete

    async def held_delete(self, also=()):       # closed, not deleted yet
        await self.close()
        started.set()
        await release.wait()
        await delete_topic(self, also)

    monkeypatch.setattr(Topic, "delete", held_delete)
    delete = asyncio.ensure_future(api.delete(T + "?force=true"))
    await started.wait()
    reply = await api.call(method, T + path, body)
    release.set()
    assert (await delete).status == 204
    assert reply.status == 404, reply
    assert "reason" in reply.body


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
