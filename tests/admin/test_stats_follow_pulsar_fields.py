"""Stats fields an audit found missing or wrong against Pulsar's TopicStats, CursorStats and
TransactionMetadata: the cursors of internalStats (readers' too, with their acknowledgement
holes), partitioned producers and consumers merged into one entry, the redelivery and expiry
rates, a subscription's unacked messages, and what an ended transaction shows."""

from __future__ import annotations

import time

from prometheus_client.parser import text_string_to_metric_families

from pyengine.client import MessageId
from tests.admin.helpers import drain

P = "/admin/v2/persistent/public/default"
TX = "/admin/v3/transactions"


async def test_internal_stats_lists_every_cursor_with_its_acknowledgement_holes(api, client):
    topic = "persistent://public/default/holes"
    producer = await client.create_producer(topic)
    ids = [await producer.send(b"m%d" % i) for i in range(6)]
    consumer = await client.subscribe(topic, "sub", initial_position="earliest", consumer_type="shared")
    received = {m.message_id: m for m in await drain(consumer)}
    assert len(received) == 6
    for i in (1, 3, 4):
        await consumer.acknowledge(received[ids[i]])
    reader = await client.create_reader(topic, MessageId.earliest)

    cursors = (await api.get(f"{P}/holes/internalStats")).body["cursors"]
    assert len(cursors) == 2
    sub = cursors["sub"]
    ledger = ids[0].ledger_id
    assert sub["markDeletePosition"] == f"{ledger}:-1"
    assert sub["individuallyDeletedMessages"] == f"[({ledger}:0..{ledger}:1],({ledger}:2..{ledger}:4]]"
    assert sub["totalNonContiguousDeletedMessagesRange"] == 2
    assert sub["numberOfEntriesSinceFirstNotAckedMessage"] == 6 and sub["active"] is True
    [(name, of_reader)] = [(n, c) for n, c in cursors.items() if n != "sub"]
    assert name.startswith("reader-") and of_reader["individuallyDeletedMessages"] == "[]"
    await consumer.acknowledge(received[ids[0]])           # the mark-delete moves past the first hole
    sub = (await api.get(f"{P}/holes/internalStats")).body["cursors"]["sub"]
    assert sub["markDeletePosition"] == f"{ledger}:1"
    assert sub["individuallyDeletedMessages"] == f"[({ledger}:2..{ledger}:4]]"
    await reader.close()
    assert list((await api.get(f"{P}/holes/internalStats")).body["cursors"]) == ["sub"]


async def test_a_partitioned_producer_and_consumer_show_once_in_partitioned_stats(api, client):
    assert (await api.put(f"{P}/pp/partitions", 2)).status == 204
    for i in (0, 1):       # one client's producer and consumer on each partition, under one name
        producer = await client.create_producer(f"persistent://public/default/pp-partition-{i}", producer_name="p")
        await client.subscribe(f"persistent://public/default/pp-partition-{i}", "s", consumer_name="c",
                               consumer_type="shared", initial_position="earliest")
        for _ in range(i + 1):
            await producer.send(b"x")
    stats = (await api.get(f"{P}/pp/partitioned-stats")).body
    assert [(p["producerName"], p["msgInCounter"]) for p in stats["publishers"]] == [("p", 3)]
    [consumer] = stats["subscriptions"]["s"]["consumers"]
    assert consumer["consumerName"] == "c" and consumer["msgOutCounter"] == 3 and consumer["unackedMessages"] == 3
    assert stats["subscriptions"]["s"]["unackedMessages"] == 3
    assert "partitions" in stats
    assert "partitions" not in (await api.get(f"{P}/pp/partitioned-stats?perPartition=false")).body
    assert (await api.get(f"{P}/pp/partitioned-stats?perPartition=maybe")).status == 400


async def test_redelivery_and_expiry_rates(api, client, service):
    name = "persistent://public/default/rates"
    producer = await client.create_producer(name)
    for _ in range(4):
        await producer.send(b"x")
    consumer = await client.subscribe(name, "s", consumer_type="shared", initial_position="earliest")
    assert len(await drain(consumer)) == 4
    await consumer.redeliver_unacknowledged_messages()
    topic = service.topics[name]
    subscription = topic.subscriptions["s"]
    await subscription.expire_messages(0, int(time.time() * 1000) + 1000)     # everything expires
    topic.update_rates(time.monotonic() + 1)
    topic_stats = (await api.get(f"{P}/rates/stats")).body
    stats = topic_stats["subscriptions"]["s"]
    assert stats["consumers"][0]["msgRateRedeliver"] > 0
    assert stats["msgRateRedeliver"] == stats["consumers"][0]["msgRateRedeliver"]
    assert stats["msgRateExpired"] > 0 and stats["totalMsgExpired"] == 4
    text = (await api.get("/metrics")).body
    samples = {(s.name, s.labels.get("subscription")): s.value for family in text_string_to_metric_families(text)
               for s in family.samples if s.labels.get("topic") == name}
    assert samples[("pulsar_subscription_msg_rate_redeliver", "s")] == stats["msgRateRedeliver"]
    assert samples[("pulsar_out_messages_total", None)] == topic_stats["msgOutCounter"] >= 4
    assert samples[("pulsar_rate_in", None)] == topic_stats["msgRateIn"] > 0


async def test_an_ended_transaction_shows_no_participants_rather_than_none(api, client):
    producer = await client.create_producer("persistent://public/default/ended")
    txn = await client.new_transaction(timeout_ms=30_000)
    await producer.send(b"x", txn=txn)
    path = f"{TX}/transactionMetadata/{txn.txn_id.most_bits}/{txn.txn_id.least_bits}"
    live = (await api.get(path)).body
    assert list(live["producedPartitions"]) == ["persistent://public/default/ended"]
    assert live["timeoutAt"] == 30_000                  # Pulsar's TxnMeta.timeoutAt: the timeout
    await txn.commit()
    ended = (await api.get(path)).body
    assert ended["status"] == "COMMITTED"
    assert ended["producedPartitions"] is None and ended["ackedPartitions"] is None


async def test_last_message_id_is_the_read_horizon(api, client):
    producer = await client.create_producer("persistent://public/default/horizon")
    sent = await producer.send(b"visible")
    txn = await client.new_transaction()
    await producer.send(b"open", txn=txn)
    last = (await api.get(f"{P}/horizon/lastMessageId")).body
    assert last == {"ledgerId": sent.ledger_id, "entryId": sent.entry_id, "partitionIndex": -1}
    await txn.commit()                       # its message and then its marker: the message is last
    last = (await api.get(f"{P}/horizon/lastMessageId")).body
    assert (last["ledgerId"], last["entryId"]) == (sent.ledger_id, sent.entry_id + 1)
    assert (await api.get(f"{P}/nowhere/lastMessageId")).status == 404
    assert (await api.put(f"{P}/parts/partitions", 2)).status == 204
    reply = await api.get(f"{P}/parts/lastMessageId")
    assert reply.status == 405 and "partitioned" in str(reply.body)


async def test_partitioned_internal_stats(api, client):
    assert (await api.put(f"{P}/pi/partitions", 2)).status == 204
    producer = await client.create_producer("persistent://public/default/pi-partition-1")
    await producer.send(b"x")
    body = (await api.get(f"{P}/pi/partitioned-internalStats")).body
    assert body["metadata"] == {"partitions": 2}
    assert body["partitions"]["persistent://public/default/pi-partition-1"]["numberOfEntries"] == 1
    assert (await api.get(f"{P}/plain-one/partitioned-internalStats")).status == 404
