"""A subscription refused on a partitioned topic (405: a message id names one partition;
409: the subscription exists already) changes nothing: no partition is created by it."""

from __future__ import annotations

P = "/admin/v2/persistent/public/default"
PT = "persistent://public/default/pt"


async def test_a_message_id_on_a_partitioned_topic_is_refused_without_creating_partitions(api, service):
    assert (await api.put(f"{P}/pt/partitions", 3)).status == 204
    reply = await api.put(f"{P}/pt/subscription/s", {"ledgerId": 1, "entryId": 0})
    assert reply.status == 405
    assert not any(service.topic_exists(f"{PT}-partition-{i}") for i in range(3))
    assert (await api.get(P)).body == []


async def test_an_existing_subscription_is_refused_without_creating_the_other_partitions(api, service):
    assert (await api.put(f"{P}/pt/partitions", 3)).status == 204
    assert (await api.put(f"{P}/pt-partition-0")).status == 204
    assert (await api.put(f"{P}/pt-partition-0/subscription/s")).status == 204
    reply = await api.put(f"{P}/pt/subscription/s")
    assert reply.status == 409
    assert (await api.get(P)).body == [f"{PT}-partition-0"]
    assert not service.topic_exists(f"{PT}-partition-1")
    # and it is created on every partition once the name is free
    assert (await api.delete(f"{P}/pt/subscription/s")).status == 204
    assert (await api.put(f"{P}/pt/subscription/s")).status == 204
    assert (await api.get(P)).body == [f"{PT}-partition-{i}" for i in range(3)]
    assert (await api.get(f"{P}/pt/subscriptions")).body == ["s"]
