"""A subscription refused on a partitioned topic (405: a message id names one partition;
409: the subscription exists already) changes nothing: it is created on no partition. (The
partitions themselves exist from the partitioned topic's creation on, as Pulsar's
tryCreatePartitionsAsync makes them.)"""

from __future__ import annotations

P = "/admin/v2/persistent/public/default"


async def test_a_message_id_on_a_partitioned_topic_is_refused_without_subscribing_any_partition(api):
    assert (await api.put(f"{P}/pt/partitions", 3)).status == 204
    reply = await api.put(f"{P}/pt/subscription/s", {"ledgerId": 1, "entryId": 0})
    assert reply.status == 405
    for index in range(3):
        assert (await api.get(f"{P}/pt-partition-{index}/subscriptions")).body == []


async def test_an_existing_subscription_is_refused_without_subscribing_the_other_partitions(api):
    assert (await api.put(f"{P}/pt/partitions", 3)).status == 204
    assert (await api.put(f"{P}/pt-partition-0/subscription/s")).status == 204
    reply = await api.put(f"{P}/pt/subscription/s")
    assert reply.status == 409
    assert (await api.get(f"{P}/pt-partition-1/subscriptions")).body == []
    # and it is created on every partition once the name is free
    assert (await api.delete(f"{P}/pt/subscription/s")).status == 204
    assert (await api.put(f"{P}/pt/subscription/s")).status == 204
    for index in range(3):
        assert (await api.get(f"{P}/pt-partition-{index}/subscriptions")).body == ["s"]
    assert (await api.get(f"{P}/pt/subscriptions")).body == ["s"]
