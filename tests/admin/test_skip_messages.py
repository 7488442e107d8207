"""`POST .../subscription/{sub}/skip/{numMessages}` (Pulsar's skipMessages): the subscription
acknowledges its next `numMessages` entries, as a consumer would see them.

As Pulsar's cursor does (IndividualDeletedEntries.Exclude), entries already acknowledged do not
count; markers and the entries of aborted transactions, which no consumer ever sees, do not
count either. It never goes past the read horizon: an open transaction's entries, and all after
them, stay. A partitioned topic refuses it (405, as Pulsar: skip a partition)."""

from __future__ import annotations

from tests.admin.helpers import drain

P = "/admin/v2/persistent/public/default"
T = "persistent://public/default/"


async def published(client, topic: str, count: int, prefix: bytes = b"m") -> list:
    producer = await client.create_producer(T + topic)
    ids = [await producer.send(prefix + b"%d" % i) for i in range(count)]
    await producer.close()
    return ids


async def received(client, topic: str, subscription: str) -> list[bytes]:
    consumer = await client.subscribe(T + topic, subscription)
    messages = await drain(consumer)
    await consumer.close()
    return [m.data for m in messages]


async def backlog(api, topic: str, subscription: str) -> int:
    return (await api.get(f"{P}/{topic}/stats")).body["subscriptions"][subscription]["msgBacklog"]


async def test_skip_the_next_messages(api, client):
    await published(client, "k", 5)
    await api.put(f"{P}/k/subscription/s", {"ledgerId": -1, "entryId": -1})
    reply = await api.post(f"{P}/k/subscription/s/skip/2")
    assert (reply.status, reply.body) == (204, None)
    assert await backlog(api, "k", "s") == 3
    assert (await api.post(f"{P}/k/subscription/s/skip/1")).status == 204
    assert await received(client, "k", "s") == [b"m3", b"m4"]           # delivered, not acked
    assert await backlog(api, "k", "s") == 2
    assert (await api.post(f"{P}/k/subscription/s/skip/100")).status == 204   # more than there is: all
    assert await backlog(api, "k", "s") == 0
    assert await received(client, "k", "s") == []
    await published(client, "k", 1, b"new")
    assert await received(client, "k", "s") == [b"new0"]


async def test_skip_takes_the_messages_held_by_a_connected_consumer(api, client):
    await published(client, "held", 4)
    consumer = await client.subscribe(T + "held", "s", initial_position="earliest")
    assert [m.data for m in await drain(consumer)] == [b"m0", b"m1", b"m2", b"m3"]
    assert (await api.post(f"{P}/held/subscription/s/skip/3")).status == 204
    await consumer.close()                                    # its unacked messages come back...
    assert await received(client, "held", "s") == [b"m3"]     # ...but not the skipped ones


async def test_acknowledged_entries_do_not_count(api, client):
    await published(client, "acked", 4)
    consumer = await client.subscribe(T + "acked", "s", initial_position="earliest")
    messages = await drain(consumer)
    await consumer.acknowledge(messages[1])
    await consumer.close()
    assert (await api.post(f"{P}/acked/subscription/s/skip/2")).status == 204     # m0 and m2
    assert await received(client, "acked", "s") == [b"m3"]


async def test_skip_stops_at_the_read_horizon(api, client):
    """An open transaction's message, and every one after it, cannot be skipped: they are
    delivered if it commits."""
    await published(client, "h", 2)
    await api.put(f"{P}/h/subscription/s", {"ledgerId": -1, "entryId": -1})
    producer = await client.create_producer(T + "h")
    txn = await client.new_transaction()
    await producer.send(b"in-txn", txn=txn)
    await producer.send(b"after")
    assert (await api.post(f"{P}/h/subscription/s/skip/10")).status == 204
    assert await backlog(api, "h", "s") == 2
    await txn.commit()
    assert await received(client, "h", "s") == [b"in-txn", b"after"]


async def test_markers_and_aborted_messages_do_not_count(api, client):
    producer = await client.create_producer(T + "ab")
    await api.put(f"{P}/ab/subscription/s", {"ledgerId": -1, "entryId": -1})
    await producer.send(b"m0")
    aborted = await client.new_transaction()
    await producer.send(b"aborted", txn=aborted)
    await aborted.abort()                                   # its entry and an abort marker
    committed = await client.new_transaction()
    await producer.send(b"committed", txn=committed)
    await committed.commit()                                # and a commit marker
    await producer.send(b"m1")
    await producer.send(b"m2")
    assert (await api.post(f"{P}/ab/subscription/s/skip/3")).status == 204      # m0, committed, m1
    assert await received(client, "ab", "s") == [b"m2"]


async def test_skip_leaves_a_transactions_pending_acks_working(api, client, service):
    """A message a transaction acknowledged (still open) may be skipped; the transaction then
    ends as usual, and an abort does not bring a skipped message back."""
    await published(client, "pa", 4)
    consumer = await client.subscribe(T + "pa", "s", initial_position="earliest")
    messages = await drain(consumer)
    aborting = await client.new_transaction()
    await consumer.acknowledge(messages[0], txn=aborting)
    committing = await client.new_transaction()
    await consumer.acknowledge(messages[3], txn=committing)
    assert (await api.post(f"{P}/pa/subscription/s/skip/2")).status == 204     # m0, m1
    await aborting.abort()
    await committing.commit()
    stats = (await api.get("/admin/v3/transactions/pendingAckStats/public/default/pa/s")).body
    assert stats["ongoingTxnSize"] == 0 and stats["pendingIndividualPositions"] == 0
    # m0 is not delivered again; the abort gives an Exclusive consumer its unacknowledged
    # messages again, in order (as Pulsar's single-active dispatcher rewinds): m2
    assert [m.data for m in await drain(consumer)] == [b"m2"]
    await consumer.close()
    assert await received(client, "pa", "s") == [b"m2"]     # m3 committed, m0 m1 skipped
    assert await backlog(api, "pa", "s") == 1


async def test_a_partitioned_topic_refuses_it_its_partitions_do_not(api, client):
    await api.put(f"{P}/pt/partitions", 2)
    assert (await api.put(f"{P}/pt/subscription/s", {"ledgerId": -1, "entryId": -1})).status == 204
    reply = await api.post(f"{P}/pt/subscription/s/skip/1")
    assert reply.status == 405 and reply.body == {"reason": "Skip messages on a partitioned topic is not allowed"}
    await published(client, "pt-partition-1", 2)
    assert (await api.post(f"{P}/pt-partition-1/subscription/s/skip/1")).status == 204
    assert await backlog(api, "pt-partition-1", "s") == 1


async def test_malformed_and_unknown(api, client):
    await published(client, "e", 1)
    await api.put(f"{P}/e/subscription/s")
    for count in ("abc", "-1", "0", "1.5", "2147483648", "9" * 40, "%20", "0x10"):
        reply = await api.post(f"{P}/e/subscription/s/skip/{count}")
        assert reply.status == 400 and "numMessages" in reply.body["reason"], (count, reply)
    assert (await api.post(f"{P}/e/subscription/nope/skip/1")).status == 404
    assert (await api.post(f"{P}/none/subscription/s/skip/1")).status == 404
    assert (await api.post("/admin/v2/persistent/public/nowhere/e/subscription/s/skip/1")).status == 404
    assert (await api.post(f"{P}/e/subscription/%20/skip/1")).status == 412
    assert (await api.get(f"{P}/e/subscription/s/skip/1")).status == 405
    assert (await api.post(f"{P}/e/subscription/s/skip/2147483647")).status == 204
    assert (await api.post(f"{P}/e/subscription/s/skip/1", raw="ignored")).status == 204


async def test_in_the_openapi_document(api):
    paths = (await api.get("/openapi.json")).body["paths"]
    operation = paths["/admin/v2/persistent/{tenant}/{namespace}/{topic}/subscription/{subName}/skip/{numMessages}"]
    assert list(operation) == ["post"]
    count = next(p for p in operation["post"]["parameters"] if p["name"] == "numMessages")
    assert count["in"] == "path" and count["schema"]["type"] == "integer" and count["schema"]["minimum"] == 1
