"""`GET .../partitioned-stats` is Pulsar's PartitionedTopicStats: a TopicStats of the whole
topic — its publishers and its subscriptions summed over the partitions — plus the stats of
each partition. Monitoring reads `subscriptions.<name>.msgBacklog` of the partitioned topic."""

from __future__ import annotations

P = "/admin/v2/persistent/public/default"
PT = "persistent://public/default/pt"


async def test_subscriptions_and_publishers_are_summed_over_the_partitions(api, client):
    assert (await api.put(f"{P}/pt/partitions", 2)).status == 204
    assert (await api.put(f"{P}/pt/subscription/s")).status == 204          # on every partition, at latest
    first = await client.create_producer(f"{PT}-partition-0", producer_name="p0")
    second = await client.create_producer(f"{PT}-partition-1", producer_name="p1")
    for producer, count in ((first, 2), (second, 1)):
        for _ in range(count):
            await producer.send(b"x")
    consumer = await client.subscribe(f"{PT}-partition-1", "s", consumer_name="c1", consumer_type="shared")

    stats = (await api.get(f"{P}/pt/partitioned-stats")).body
    assert stats["msgInCounter"] == 3 and stats["msgBacklog"] == 3
    assert sorted(p["producerName"] for p in stats["publishers"]) == ["p0", "p1"]
    assert set(stats["subscriptions"]) == {"s"}
    whole = stats["subscriptions"]["s"]
    assert whole["msgBacklog"] == 3 and whole["type"] == "Shared" and whole["isDurable"] is True
    assert [c["consumerName"] for c in whole["consumers"]] == ["c1"]
    per_partition = [stats["partitions"][f"{PT}-partition-{i}"]["subscriptions"]["s"]["msgBacklog"] for i in (0, 1)]
    assert per_partition == [2, 1]
    await consumer.close()
