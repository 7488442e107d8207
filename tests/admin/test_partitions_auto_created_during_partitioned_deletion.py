"""A producer (the binary protocol's or the embedding API's auto-creation, which takes no admin
turn) creating a topic while a REST request changes its partitioned topic (found by an audit).
A partition created while its partitioned topic was deleted was left behind, stored without its
partitioned topic, after the deletion answered 204. As Pulsar (which refuses to auto-create a
partition of a partitioned topic being deleted): a creation under way is waited for and deleted
with the others, one that starts meanwhile fails TopicNotFound. A plain topic being created
when a partitioned topic of its name was created: both were left."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.broker.topic import Topic
from pyengine.errors import TopicNotFoundError

from tests.admin.test_topic_lifecycle_under_concurrency import hold_load

T = "/admin/v2/persistent/public/default/autorace"
NAME = "persistent://public/default/autorace"


async def test_a_partition_being_auto_created_is_deleted_with_its_partitioned_topic(api, service, monkeypatch):
    assert (await api.put(T + "/partitions", 2)).status == 204
    assert (await api.delete(T + "-partition-1")).status == 204
    started, release = hold_load(monkeypatch, NAME + "-partition-1")
    create = asyncio.ensure_future(service.get_topic(NAME + "-partition-1"))
    await started.wait()                                # a producer is creating partition 1
    delete = asyncio.ensure_future(api.delete(T + "/partitions"))
    await asyncio.sleep(0.05)
    release.set()
    reply = await delete
    await asyncio.gather(create, return_exceptions=True)
    assert reply.status == 204, reply.body
    assert service.policies.partitions(NAME) == 0
    assert service.list_topics("public/default") == []
    assert NAME + "-partition-1" not in service.topics


async def test_a_partition_auto_created_after_the_deletion_passed_it_is_refused(api, service, monkeypatch):
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
    try:
        with pytest.raises(TopicNotFoundError):
            await service.get_topic(NAME + "-partition-0")      # a producer on partition 0
    finally:
        release.set()
    assert (await delete).status == 204
    assert service.list_topics("public/default") == []
    # Once deleted, the name is free again: nothing is left refusing it.
    assert service.topic_exists(NAME + "-partition-0") is False
    assert not service._deleting_partitioned


async def test_a_partitioned_topic_is_not_created_over_a_plain_topic_being_auto_created(api, service, monkeypatch):
    """The same name both a plain topic (a producer's first use, loading) and a partitioned
    topic (created over REST meanwhile): the REST check found no stored topic yet."""
    started, release = hold_load(monkeypatch, NAME)
    create = asyncio.ensure_future(service.get_topic(NAME))          # a producer on the plain name
    await started.wait()
    partitioned = asyncio.ensure_future(api.put(T + "/partitions", 2))
    await asyncio.sleep(0.05)
    release.set()
    await create
    reply = await partitioned
    assert reply.status == 409, reply.body
    assert service.policies.partitions(NAME) == 0 and service.topic_exists(NAME)
