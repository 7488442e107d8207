"""Admin requests that run while a topic is created or deleted (found by an audit). Each request
checked the stored state, then awaited its writes; a second one meanwhile passed the same
checks: a name was left both a plain and a partitioned topic, a partition or a topic-level policy
outlived its deleted topic, a topic was left in a deleted namespace, and requests on a topic
being deleted failed with 500. The slow step is held by an event, so each interleaving is the
same at every run."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.broker.topic import Topic

NS = "/admin/v2/namespaces/public/default"
T = "/admin/v2/persistent/public/default/race"
NAME = "persistent://public/default/race"


def hold_load(monkeypatch, name: str) -> tuple[asyncio.Event, asyncio.Event]:
    """Hold the load (so the creation) of topic `name` until `release` is set."""
    started, release = asyncio.Event(), asyncio.Event()
    load = Topic.load.__func__

    async def held(cls, service, topic_name):
        if str(topic_name) == name:
            started.set()
            await release.wait()
        return await load(cls, service, topic_name)

    monkeypatch.setattr(Topic, "load", classmethod(held))
    return started, release


async def stored_policies(service, name: str) -> dict:
    """The topic-level policies as stored (not as cached)."""
    service.policies._cache.clear()
    return service.policies.topic_policies(name)


async def test_a_plain_and_a_partitioned_topic_created_at_once_under_one_name(api, service, monkeypatch):
    started, release = hold_load(monkeypatch, NAME)
    plain = asyncio.ensure_future(api.put(T))
    await started.wait()                                # the plain topic is being created
    partitioned = asyncio.ensure_future(api.put(T + "/partitions", 2))
    await asyncio.sleep(0.05)
    release.set()
    statuses = sorted([(await plain).status, (await partitioned).status])
    assert statuses == [204, 409]
    assert not (service.policies.partitions(NAME) and service.topic_exists(NAME))


async def test_a_namespace_deleted_while_one_of_its_topics_is_created(api, service, monkeypatch):
    assert (await api.put("/admin/v2/namespaces/public/racing")).status == 204
    started, release = hold_load(monkeypatch, "persistent://public/racing/t")
    create = asyncio.ensure_future(api.put("/admin/v2/persistent/public/racing/t"))
    await started.wait()
    delete = asyncio.ensure_future(api.delete("/admin/v2/namespaces/public/racing"))
    await asyncio.sleep(0.05)
    release.set()
    create, delete = await create, await delete
    assert (create.status, delete.status) == (204, 409)        # the namespace is not empty
    assert service.policies.namespace_exists("public/racing")
    assert service.list_topics("public/racing") == ["persistent://public/racing/t"]


async def test_partitions_added_while_the_partitioned_topic_is_deleted_are_deleted_with_it(api, service, monkeypatch):
    assert (await api.put(T + "/partitions", 1)).status == 204
    started, release = hold_load(monkeypatch, NAME + "-partition-2")
    update = asyncio.ensure_future(api.post(T + "/partitions", 3))
    await started.wait()                                # partition 1 created, partition 2 being created
    delete = asyncio.ensure_future(api.delete(T + "/partitions"))
    await asyncio.sleep(0.05)
    release.set()
    assert ((await update).status, (await delete).status) == (204, 204)
    assert service.policies.partitions(NAME) == 0
    assert service.list_topics("public/default") == []


async def test_a_partition_created_while_its_partitioned_topic_is_deleted_is_deleted_with_it(api, service,
                                                                                              monkeypatch):
    assert (await api.put(T + "/partitions", 2)).status == 204
    assert (await api.delete(T + "-partition-1")).status == 204
    started, release = hold_load(monkeypatch, NAME + "-partition-1")
    create = asyncio.ensure_future(api.put(T + "-partition-1"))
    await started.wait()
    delete = asyncio.ensure_future(api.delete(T + "/partitions"))
    await asyncio.sleep(0.05)
    release.set()
    assert ((await create).status, (await delete).status) == (204, 204)
    assert service.list_topics("public/default") == []


@pytest.mark.parametrize("path", ["/messageTTL?messageTTL=5", "/maxProducers", "/backlogQuota"])
async def test_a_topic_policy_set_while_its_topic_is_deleted_does_not_outlive_it(api, service, monkeypatch, path):
    assert (await api.put(T)).status == 204
    topic = service.topics[NAME]
    started, release = asyncio.Event(), asyncio.Event()
    delete_buffer = topic.buffer.delete

    async def held_delete():                # the topic's LMDB write is done, its buffer's not yet
        started.set()
        await release.wait()
        await delete_buffer()

    monkeypatch.setattr(topic.buffer, "delete", held_delete)
    delete = asyncio.ensure_future(api.delete(T))
    await started.wait()
    body = {"/maxProducers": 4, "/backlogQuota": {"limitSize": 1 << 30, "policy": "producer_request_hold"}}.get(path)
    change = asyncio.ensure_future(api.post(T + path, body))
    await asyncio.sleep(0.05)
    release.set()
    assert (await delete).status == 204
    change = await change
    assert await stored_policies(service, NAME) == {}
    assert change.status == 404                         # its topic is gone
    assert (await api.put(T)).status == 204             # created again: without the policy
    assert service.policies.topic_policies(NAME) == {}


@pytest.mark.parametrize("method,path,body", [
    ("GET", "/lastMessageId", None), ("POST", "/terminate", None), ("POST", "/trim", None),
    ("POST", "/subscription/s/skip/1", None), ("POST", "/subscription/s/resetcursor/0", None),
    # these answered 204 for what the closed topic's subscriptions did not do (found by an audit)
    ("POST", "/subscription/s/skip_all", None), ("POST", "/subscription/s/expireMessages/0", None),
    ("POST", "/subscription/s/expireMessages", {"ledgerId": 0, "entryId": 0}),
    ("POST", "/all_subscription/expireMessages/0", None),
    ("POST", "/subscription/s/resetcursor", {"ledgerId": -1, "entryId": -1}),
    ("DELETE", "/subscription/s", None), ("GET", "/subscriptions", None)])
async def test_requests_on_a_topic_being_deleted_are_404(api, service, client, monkeypatch, method, path, body):
    assert (await api.put(T)).status == 204
    assert (await api.put(T + "/subscription/s", {"ledgerId": -1, "entryId": -1})).status == 204
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
    assert reply.status == 404, reply.body
    assert "reason" in reply.body


async def test_a_subscription_created_while_its_partitioned_topic_is_deleted_leaves_no_partition(api, service,
                                                                                                 monkeypatch):
    assert (await api.put(T + "/partitions", 2)).status == 204
    started, release = asyncio.Event(), asyncio.Event()
    delete_topic = Topic.delete

    async def held_delete(self, also=()):       # partition 0 is deleted, partition 1 being deleted
        if self.name.endswith("-partition-1"):
            started.set()
            await release.wait()
        await delete_topic(self, also)

    monkeypatch.setattr(Topic, "delete", held_delete)
    delete = asyncio.ensure_future(api.delete(T + "/partitions"))
    await started.wait()
    create = asyncio.ensure_future(api.put(T + "/subscription/s"))
    await asyncio.sleep(0.05)
    release.set()
    assert (await delete).status == 204
    create = await create
    assert service.policies.partitions(NAME) == 0
    assert service.list_topics("public/default") == [NAME]
    assert create.status == 204                 # after the deletion: a new plain topic with it, as Apache
    assert (await api.get(T + "/subscriptions")).body == ["s"]


async def test_a_namespace_deleted_while_a_producer_auto_creates_one_of_its_topics(api, service, monkeypatch):
    """The same race through the binary protocol's (or the embedding API's) auto-creation,
    which takes no admin turn: a topic being loaded counts as one of the namespace's."""
    assert (await api.put("/admin/v2/namespaces/public/racing")).status == 204
    started, release = hold_load(monkeypatch, "persistent://public/racing/auto")
    create = asyncio.ensure_future(service.get_topic("persistent://public/racing/auto"))
    await started.wait()
    delete = await api.delete("/admin/v2/namespaces/public/racing")
    release.set()
    await create
    assert delete.status == 409, delete.body                        # the namespace is not empty
    assert service.policies.namespace_exists("public/racing")
    assert service.list_topics("public/racing") == ["persistent://public/racing/auto"]
