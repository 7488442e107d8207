"""Persistent topics: listing, plain and partitioned topics, stats, de-duplication policy and
termination, with Pulsar's statuses for each refusal."""

from __future__ import annotations

import pytest

from pyengine.client.message import MessageId
from pyengine.errors import TopicTerminatedError
from pyengine.protocol.commands import message_metadata
from pyengine.storage.entry import headers_and_payload

P = "/admin/v2/persistent/public/default"


async def test_create_list_delete_topic(api, service):
    assert (await api.put(f"{P}/plain")).status == 204
    assert service.topic_exists("persistent://public/default/plain")
    assert (await api.get(P)).body == ["persistent://public/default/plain"]
    assert (await api.put(f"{P}/plain")).status == 409
    assert (await api.delete(f"{P}/plain")).status == 204
    assert not service.topic_exists("persistent://public/default/plain")
    assert (await api.delete(f"{P}/plain")).status == 404
    assert (await api.get(P)).body == []


async def test_topic_errors(api):
    assert (await api.put("/admin/v2/persistent/public/nowhere/t")).status == 404    # no such namespace
    assert (await api.get("/admin/v2/persistent/public/nowhere")).status == 404
    assert (await api.put(f"{P}/%20padded")).status == 412                           # Pulsar: name not valid
    assert (await api.put(f"{P}/" + "x" * 201)).status == 412
    assert (await api.put(f"{P}/" + "é" * 150)).status == 412                        # 300 bytes of UTF-8
    assert (await api.get(f"{P}/missing/stats")).status == 404
    assert (await api.get(f"{P}/missing/internalStats")).status == 404
    assert (await api.call("DELETE", f"{P}/t?force=maybe")).status == 400


async def test_delete_refuses_connected_clients_unless_forced(api, client):
    await client.create_producer("persistent://public/default/busy")
    reply = await api.delete(f"{P}/busy")
    assert reply.status == 412 and reply.body == {"reason": "Topic has active producers/subscriptions"}
    assert (await api.call("DELETE", f"{P}/busy?force=true")).status == 204
    assert (await api.get(f"{P}/busy/stats")).status == 404


async def test_partitioned_topic_lifecycle(api, service, client):
    """The official client's tests create partitioned topics with PUT .../partitions and a
    bare number as the body; a repeated PUT is 409, which they ignore."""
    assert (await api.put(f"{P}/orders/partitions", raw="4")).status == 204
    assert (await api.put(f"{P}/orders/partitions", raw="4")).status == 409
    assert (await api.get(f"{P}/orders/partitions")).body == {"partitions": 4}
    # 0 partitions is a non-partitioned topic that exists; one that does not is 404, unless the
    # caller asks as a client about to create it (Pulsar's checkAllowAutoCreation).
    assert (await api.get(f"{P}/plain/partitions")).status == 404
    assert (await api.get(f"{P}/plain/partitions?checkAllowAutoCreation=true")).body == {"partitions": 0}
    assert (await api.put(f"{P}/plain")).status == 204
    assert (await api.get(f"{P}/plain/partitions")).body == {"partitions": 0}
    assert (await api.delete(f"{P}/plain")).status == 204
    assert (await api.get(f"{P}/partitioned")).body == ["persistent://public/default/orders"]
    assert service.policies.partitions("persistent://public/default/orders") == 4

    assert (await api.post(f"{P}/orders/partitions", 6)).status == 204
    assert (await api.get(f"{P}/orders/partitions")).body == {"partitions": 6}
    reply = await api.post(f"{P}/orders/partitions", 2)
    assert reply.status == 422 and "can't less than current" in reply.body["reason"]

    producer = await client.create_producer("persistent://public/default/orders-partition-1")
    await producer.send(b"x")
    # Every partition exists from its creation on, as Pulsar's tryCreatePartitionsAsync makes them.
    partitions = [f"persistent://public/default/orders-partition-{index}" for index in range(6)]
    assert sorted((await api.get(P)).body) == partitions
    stats = (await api.get(f"{P}/orders/partitioned-stats")).body
    assert stats["metadata"] == {"partitions": 6} and stats["msgInCounter"] == 1
    assert sorted(stats["partitions"]) == partitions

    assert (await api.delete(f"{P}/orders/partitions")).status == 412     # the producer is connected
    await producer.close()
    assert (await api.delete(f"{P}/orders/partitions")).status == 204
    assert (await api.get(f"{P}/orders/partitions")).status == 404
    assert not service.topic_exists("persistent://public/default/orders-partition-1")
    assert (await api.delete(f"{P}/orders/partitions")).status == 404


async def test_added_partitions_get_the_subscriptions_of_partition_0(api, service, client):
    """As Pulsar's update of a partitioned topic: the new partitions are subscribed as partition
    0 is, so what is published there before any consumer comes is kept for the subscription."""
    assert (await api.put(f"{P}/grown/partitions", raw="2")).status == 204
    for index in range(2):
        consumer = await client.subscribe(f"persistent://public/default/grown-partition-{index}", "audit")
        await consumer.close()
    assert (await api.post(f"{P}/grown/partitions", 3)).status == 204
    producer = await client.create_producer("persistent://public/default/grown-partition-2")
    await producer.send(b"before any consumer of partition 2")
    stats = (await api.get(f"{P}/grown-partition-2/stats")).body
    assert stats["subscriptions"]["audit"]["msgBacklog"] == 1
    assert (await api.put(f"{P}/fresh/partitions", raw="1")).status == 204       # nothing subscribed: nothing copied
    assert (await api.post(f"{P}/fresh/partitions", 2)).status == 204
    # (the added partition exists, as Pulsar's update creates it with tryCreatePartitionsAsync)
    assert (await api.get(f"{P}/fresh-partition-1/subscriptions")).body == []


async def test_adding_partitions_refuses_stored_partitions_beyond_the_count_unless_forced(api, service, client):
    """As Pulsar's internalUpdatePartitionedTopicAsync: a stored topic named as a partition past
    the current count would silently become a partition: 409, unless force=true; then, as for
    every partition, partition 0's durable subscriptions are created on it at the earliest
    position (its messages are kept for them)."""
    assert (await api.put(f"{P}/lo/partitions", raw="2")).status == 204
    consumer = await client.subscribe("persistent://public/default/lo-partition-0", "audit")
    await consumer.close()
    leftover = await service.get_topic("persistent://public/default/lo-partition-3")     # as left by an older broker
    # (stored through the topic: a client's producer of a partition past the count is refused)
    raw = leftover.add_producer("raw")
    metadata = message_metadata("raw", 0, 1).SerializeToString()
    await leftover.publish(raw, headers_and_payload(metadata, b"stored before the partition count covered it"),
                           sequence_id=0)
    leftover.remove_producer(raw)
    assert leftover.name in service.topics
    reply = await api.post(f"{P}/lo/partitions", 4)
    assert reply.status == 409 and "lo-partition-3" in reply.body["reason"]
    assert service.policies.partitions("persistent://public/default/lo") == 2          # nothing changed
    assert "audit" not in leftover.subscriptions
    assert (await api.call("POST", f"{P}/lo/partitions?force=maybe", 4)).status == 400
    assert (await api.call("POST", f"{P}/lo/partitions?force=true", 4)).status == 204
    assert service.policies.partitions("persistent://public/default/lo") == 4
    stats = (await api.get(f"{P}/lo-partition-3/stats")).body
    assert stats["subscriptions"]["audit"]["msgBacklog"] == 1


async def test_adding_partitions_copies_subscriptions_to_every_partition_lacking_them(api, service, client):
    """Pulsar creates partition 0's durable subscriptions on every partition (conflicts
    ignored), also an existing one that lacks them, and also when the count stays the same;
    a reader's (non-durable) subscription is not copied."""
    assert (await api.put(f"{P}/wide/partitions", raw="2")).status == 204
    producer = await client.create_producer("persistent://public/default/wide-partition-1")
    await producer.send(b"on partition 1 before it had the subscription")
    consumer = await client.subscribe("persistent://public/default/wide-partition-0", "audit")
    reader = await client.create_reader("persistent://public/default/wide-partition-0", MessageId.earliest)
    assert (await api.post(f"{P}/wide/partitions", 2)).status == 204          # same count: still copied
    assert service.policies.partitions("persistent://public/default/wide") == 2
    stats = (await api.get(f"{P}/wide-partition-1/stats")).body
    assert list(stats["subscriptions"]) == ["audit"] and stats["subscriptions"]["audit"]["msgBacklog"] == 1
    await reader.close()
    await consumer.close()
    assert (await api.post(f"{P}/wide-partition-0/partitions", 3)).status == 412    # a partition's name


async def test_partitioned_topic_errors(api):
    path = f"{P}/p/partitions"
    assert (await api.put(path, 0)).status == 406
    assert (await api.put(path, -3)).status == 406
    assert (await api.put(path, 10**30)).status == 406                   # huge: refused, not attempted
    assert (await api.put(path, raw="1" * 5000)).status == 400           # past Python's int digit limit
    assert (await api.put(path, 2.5)).status == 400
    assert (await api.put(path, True)).status == 400
    assert (await api.put(path, "4")).status == 400                      # a string, not a number
    assert (await api.put(path, raw="NaN")).status == 400
    assert (await api.put(path)).status == 400                           # no body
    assert (await api.post(f"{P}/never/partitions", 3)).status == 409    # Pulsar: not a partitioned topic
    assert (await api.put("/admin/v2/persistent/public/nowhere/p/partitions", 2)).status == 404
    assert (await api.put(f"{P}/p-partition-0/partitions", 2)).status == 412
    await api.put(f"{P}/plain")
    assert (await api.put(f"{P}/plain/partitions", 2)).status == 409    # a plain topic has the name
    await api.put(f"{P}/parted/partitions", 2)
    assert (await api.put(f"{P}/parted")).status == 409
    assert (await api.delete(f"{P}/parted")).status == 409
    assert (await api.get(f"{P}/parted/stats")).status == 404
    assert (await api.get(f"{P}/plain/partitioned-stats")).status == 404


async def test_stats_follow_traffic(api, client):
    producer = await client.create_producer("persistent://public/default/flow", producer_name="prod-1")
    consumer = await client.subscribe("persistent://public/default/flow", "sub-1", initial_position="earliest",
                                      consumer_name="cons-1")
    for i in range(3):
        await producer.send(b"m%d" % i)
    stats = (await api.get(f"{P}/flow/stats")).body
    assert stats["msgInCounter"] == 3 and stats["bytesInCounter"] > 0 and stats["storageSize"] > 0
    assert [(p["producerName"], p["producerId"], p["msgInCounter"]) for p in stats["publishers"]] == [("prod-1", 0, 3)]
    sub = stats["subscriptions"]["sub-1"]
    assert sub["type"] == "Exclusive" and sub["isDurable"] and sub["msgBacklog"] == 3
    assert [c["consumerName"] for c in sub["consumers"]] == ["cons-1"]
    for _ in range(3):
        await consumer.acknowledge(await consumer.receive(timeout=5))
    assert (await api.get(f"{P}/flow/stats")).body["subscriptions"]["sub-1"]["msgBacklog"] == 0

    internal = (await api.get(f"{P}/flow/internalStats")).body
    assert internal["numberOfEntries"] == 3 and internal["state"] == "LedgerOpened"
    assert internal["lastConfirmedEntry"].endswith(":2")
    assert internal["cursors"]["sub-1"]["markDeletePosition"] == internal["lastConfirmedEntry"]
    assert sum(ledger["entries"] for ledger in internal["ledgers"]) == 3


async def test_topic_deduplication_policy(api, client, service):
    path = f"{P}/d/deduplicationEnabled"
    assert (await api.get(path)).status == 404                           # no such topic yet
    await client.create_producer("persistent://public/default/d")
    topic = service.topics["persistent://public/default/d"]
    assert (await api.get(path)).status == 204                           # not set on the topic
    assert (await api.get(path + "?applied=true")).body is False         # the broker's default
    assert (await api.post(path, True)).status == 204
    assert (await api.get(path)).body is True and topic.dedup.enabled
    assert (await api.get(f"{P}/d/stats")).body["deduplicationStatus"] == "Enabled"
    assert (await api.delete(path)).status == 204 and not topic.dedup.enabled
    assert (await api.post(path, "yes")).status == 400
    assert (await api.get(path + "?applied=sometimes")).status == 400
    await api.put(f"{P}/pt/partitions", 2)                               # on a partitioned topic too
    assert (await api.post(f"{P}/pt/deduplicationEnabled", True)).status == 204
    assert (await api.get(f"{P}/pt-partition-1/deduplicationEnabled")).body is True
    assert (await api.get(f"{P}/pt-partition-2/deduplicationEnabled")).status == 404


async def test_terminate(api, client):
    producer = await client.create_producer("persistent://public/default/end")
    sent = await producer.send(b"last")
    reply = await api.post(f"{P}/end/terminate")
    assert reply.status == 200
    assert reply.body == {"ledgerId": sent.ledger_id, "entryId": sent.entry_id, "partitionIndex": -1}
    with pytest.raises(TopicTerminatedError):
        await producer.send(b"too late")
    assert (await api.get(f"{P}/end/internalStats")).body["state"] == "Terminated"
    await api.put(f"{P}/pt/partitions", 2)
    reply = await api.post(f"{P}/pt/terminate")
    assert reply.status == 405 and reply.body["reason"] == "Termination of a partitioned topic is not allowed"
    assert (await api.post(f"{P}/none/terminate")).status == 404
