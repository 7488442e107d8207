"""The rest of Pulsar's Transactions admin resource (v3): the internal stats of the transaction
logs (`coordinatorInternalStats`, `pendingAckInternalStats`, `transactionBufferInternalStats`),
where a position stands in a subscription's pending acks (`positionStatsInPendingAck`), the
scaling of the transaction coordinators (`transactionCoordinator/replicas`), and the
`segmentStats` of `transactionBufferStats` and the recovery times of `coordinatorStats`.

Each route is checked to follow the state it reports (never a constant), to refuse what Pulsar
refuses with a JSON error of Pulsar's status, and to keep to its OpenAPI schema."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.broker.policies import TC_ASSIGN_TOPIC
from pyengine.errors import NotAllowedError
from pyengine.protocol.lookup import partition_count
from pyengine.transaction import TxnStatus
from pyengine.transaction.buffer.config import TopicTransactionBufferConfig
from pyengine.transaction.coordinator.keys import ANONYMOUS, NO_EPOCH, coordinator_for
from pyengine.transaction.coordinator.metadata_records import V5_COORDINATOR_ID
from pyengine.transaction.pendingack import IndividualAck
from pyengine.transaction.pendingack.handle import HandleState
from pyengine_kernels import Position
from tests.admin.conftest import restartable_broker
from tests.admin.test_stats_fields_in_schema import undescribed

TX = "/admin/v3/transactions"
IN = "persistent://public/default/in"
OUT = "persistent://public/default/out"
ROUTES = {
    "coordinatorInternalStats": "/coordinatorInternalStats/{coordinatorId}",
    "pendingAckInternalStats": "/pendingAckInternalStats/{tenant}/{namespace}/{topic}/{subName}",
    "transactionBufferInternalStats": "/transactionBufferInternalStats/{tenant}/{namespace}/{topic}",
    "positionStatsInPendingAck": "/positionStatsInPendingAck/{tenant}/{namespace}/{topic}/{subName}/{ledgerId}"
                                 "/{entryId}",
}


broker = restartable_broker


async def keeps_to_its_schema(api, route: str, body, method: str = "get") -> None:
    document = (await api.get("/openapi.json")).body
    schema = document["paths"][TX + route][method]["responses"]["200"]["content"]["application/json"]["schema"]
    assert undescribed(body, schema) == [], body
    assert set(schema.get("required", ())) <= set(body)


def is_json_error(reply, status: int) -> bool:
    return reply.status == status and isinstance(reply.body, dict) and bool(reply.body.get("reason"))


def log_of(body: dict, field: str) -> tuple[str, int, int]:
    """(managedLedgerName, numberOfEntries, totalSize) of a TransactionLogStats in `body`."""
    stats = body[field]
    internal = stats["managedLedgerInternalStats"]
    assert internal["ledgers"] == [] and internal["cursors"] == {}           # an LMDB key range
    return stats["managedLedgerName"], internal["numberOfEntries"], internal["totalSize"]


async def messages_on_in(client, count: int, consumer_type: str = "shared"):
    source = await client.create_producer(IN)
    for i in range(count):
        await source.send(b"m%d" % i)
    consumer = await client.subscribe(IN, "sub", initial_position="earliest", consumer_type=consumer_type)
    return consumer, [await consumer.receive(timeout=5) for _ in range(count)]


# --- coordinatorInternalStats --------------------------------------------------------------

async def test_coordinator_internal_stats_follow_the_coordinators_log(api, client, service):
    txn = await client.new_transaction(timeout_ms=600_000)
    cid, other = txn.txn_id.most_bits, 1 - txn.txn_id.most_bits
    path = f"{TX}/coordinatorInternalStats/{cid}"
    body = (await api.get(path)).body
    name, records, size = log_of(body, "transactionLogStats")
    assert name == f"pulsar/system/persistent/__transaction_log_{cid}"
    assert records == 1 and size > 0                                       # the txn's NEW record
    await keeps_to_its_schema(api, ROUTES["coordinatorInternalStats"], body)

    producer = await client.create_producer(OUT)
    await producer.send(b"x", txn=txn)                                      # + its ADD_PARTITION record
    _, records, grown = log_of((await api.get(path)).body, "transactionLogStats")
    assert records == 2 and grown > size
    assert (await api.get(path + "?metadata=true")).body == (await api.get(path)).body
    # the other coordinator's log is its own, still empty
    assert log_of((await api.get(f"{TX}/coordinatorInternalStats/{other}")).body, "transactionLogStats")[1:] == (0, 0)

    await txn.commit()
    await service.coordinator_v4.wait_for_endings()
    _, records, _ = log_of((await api.get(path)).body, "transactionLogStats")
    assert records == 1                                                     # trimmed to one FINISHED record


async def test_coordinator_internal_stats_refuse_what_pulsar_refuses(api):
    assert is_json_error(await api.get(f"{TX}/coordinatorInternalStats/2"), 404)     # the broker runs 0 and 1
    assert is_json_error(await api.get(f"{TX}/coordinatorInternalStats/{V5_COORDINATOR_ID}"), 405)   # keeps no log
    for malformed in ("x", "-1", "1.5", str(2**64), "%20"):
        assert is_json_error(await api.get(f"{TX}/coordinatorInternalStats/{malformed}"), 400), malformed
    assert is_json_error(await api.get(f"{TX}/coordinatorInternalStats/0?metadata=maybe"), 400)


async def test_coordinator_stats_carry_the_recovery_times(tmp_path):
    async with broker(tmp_path / "data", num_coordinators=1) as (_service, api, client):
        first = (await api.get(f"{TX}/coordinatorStats?coordinatorId=0")).body
        assert 0 < first["recoverStartTime"] <= first["recoverEndTime"]
        await client.new_transaction()
    async with broker(tmp_path / "data", num_coordinators=1) as (_service, api, _client):
        again = (await api.get(f"{TX}/coordinatorStats?coordinatorId=0")).body
        assert again["recoverStartTime"] >= first["recoverEndTime"]          # this start's recovery
        assert again["recoverEndTime"] >= again["recoverStartTime"] and again["ongoingTxnSize"] == 1
        every = (await api.get(f"{TX}/coordinatorStats")).body
        assert every["0"]["recoverStartTime"] == again["recoverStartTime"]
        await keeps_to_its_schema(api, "/coordinatorStats", again)


# --- pendingAckInternalStats ---------------------------------------------------------------

async def test_pending_ack_internal_stats_follow_the_subscriptions_log(api, client):
    consumer, messages = await messages_on_in(client, 2)
    path = f"{TX}/pendingAckInternalStats/public/default/in/sub"
    reply = await api.get(path)
    assert reply.status == 200
    name, records, size = log_of(reply.body, "pendingAckLogStats")
    assert name == "public/default/persistent/in-sub__transaction_pending_ack"
    assert (records, size) == (0, 0)

    txn = await client.new_transaction(timeout_ms=600_000)
    await consumer.acknowledge(messages[0], txn=txn)
    await consumer.acknowledge(messages[1], txn=txn)
    body = (await api.get(path)).body
    _, records, size = log_of(body, "pendingAckLogStats")
    assert records == 2 and size > 0                                        # one record per ack request
    await keeps_to_its_schema(api, ROUTES["pendingAckInternalStats"], body)
    assert (await api.get(path + "?metadata=true")).body == body

    await txn.abort()                                                       # its records go with it
    assert log_of((await api.get(path)).body, "pendingAckLogStats")[1:] == (0, 0)


async def test_pending_ack_internal_stats_refuse_what_pulsar_refuses(api, client, service):
    await messages_on_in(client, 1)
    assert (await api.put("/admin/v2/persistent/public/default/parted/partitions", 2)).status == 204
    base = f"{TX}/pendingAckInternalStats"
    assert is_json_error(await api.get(f"{base}/public/default/in/nosub"), 404)
    assert is_json_error(await api.get(f"{base}/public/default/nothere/sub"), 404)
    assert is_json_error(await api.get(f"{base}/public/nowhere/in/sub"), 404)
    assert is_json_error(await api.get(f"{base}/public/default/parted/sub"), 404)     # a partitioned topic
    assert is_json_error(await api.get(f"{base}/bad%20tenant/default/in/sub"), 412)
    assert is_json_error(await api.get(f"{base}/public/default/in/sub?metadata=2"), 400)

    # a v5 subscription's pending acks are metadata records, not a log (Pulsar: 405)
    await service.policies.create_namespace("public/v5")
    assert (await api.post("/admin/v2/namespaces/public/v5/transactionVersion", 5)).status == 204
    await client.subscribe("persistent://public/v5/in", "sub")
    assert is_json_error(await api.get(f"{base}/public/v5/in/sub"), 405)


# --- transactionBufferInternalStats --------------------------------------------------------

async def test_transaction_buffer_internal_stats_follow_the_snapshot_stores(tmp_path):
    config = TopicTransactionBufferConfig(snapshot_segment_aborts=2)
    async with broker(tmp_path / "data", transaction_buffer=config) as (service, api, client):
        path = f"{TX}/transactionBufferInternalStats/public/default/out"
        producer = await client.create_producer(OUT)
        await producer.send(b"plain")
        assert is_json_error(await api.get(path), 404)                     # no snapshot stored yet

        txn = await client.new_transaction()
        await producer.send(b"x", txn=txn)
        await txn.commit()
        await service.topics[OUT].buffer.take_snapshot()
        body = (await api.get(path)).body
        assert body["snapshotType"] == "Segment" and body["singleSnapshotSystemTopicInternalStats"] is None
        name, segments, _ = log_of(body, "segmentInternalStats")
        assert name == "public/default/persistent/__transaction_buffer_snapshot_segments" and segments == 0
        name, indexes, index_size = log_of(body, "segmentIndexInternalStats")
        assert name == "public/default/persistent/__transaction_buffer_snapshot_indexes"
        assert indexes == 1 and index_size > 0
        await keeps_to_its_schema(api, ROUTES["transactionBufferInternalStats"], body)

        for _ in range(5):                      # 5 aborts, 2 per sealed segment: 2 segments, 1 unsealed
            txn = await client.new_transaction()
            await producer.send(b"x", txn=txn)
            await txn.abort()
        await service.topics[OUT].buffer.take_snapshot()
        body = (await api.get(path + "?metadata=true")).body
        _, segments, segments_size = log_of(body, "segmentInternalStats")
        assert segments == 2 and segments_size > 0
        assert log_of(body, "segmentIndexInternalStats")[1] == 1
        assert (await api.get(path)).body == body


async def test_transaction_buffer_internal_stats_refuse_what_pulsar_refuses(tmp_path):
    no_snapshots = TopicTransactionBufferConfig(snapshots_enabled=False)
    async with broker(tmp_path / "data", transaction_buffer=no_snapshots) as (service, api, client):
        producer = await client.create_producer(OUT)
        txn = await client.new_transaction()
        await producer.send(b"x", txn=txn)
        await txn.commit()
        base = f"{TX}/transactionBufferInternalStats"
        assert is_json_error(await api.get(f"{base}/public/default/out"), 404)    # snapshots disabled
        assert is_json_error(await api.get(f"{base}/public/default/nothere"), 404)
        assert is_json_error(await api.get(f"{base}/nobody/default/out"), 404)
        assert (await api.put("/admin/v2/persistent/public/default/parted/partitions", 2)).status == 204
        assert is_json_error(await api.get(f"{base}/public/default/parted"), 404)   # a partitioned topic
        assert is_json_error(await api.get(f"{base}/public/default/out?metadata=yes"), 400)
        assert is_json_error(await api.get(f"{base}/public/bad%0Ans/out"), 412)

        await service.policies.create_namespace("public/v5")          # a v5 buffer keeps no snapshots
        assert (await api.post("/admin/v2/namespaces/public/v5/transactionVersion", 5)).status == 204
        v5 = await client.create_producer("persistent://public/v5/out")
        txn = await client.new_transaction(version=5)
        await v5.send(b"x", txn=txn)
        await txn.commit()
        assert is_json_error(await api.get(f"{base}/public/v5/out"), 404)


# --- transactionBufferStats?segmentStats ------------------------------------------------------

async def test_segment_stats_list_each_sealed_segment(tmp_path):
    config = TopicTransactionBufferConfig(snapshot_segment_aborts=2)
    async with broker(tmp_path / "data", transaction_buffer=config) as (service, api, client):
        producer = await client.create_producer(OUT)
        aborted = []
        for _ in range(5):
            txn = await client.new_transaction()
            await producer.send(b"x", txn=txn)
            await txn.abort()
            aborted.append(txn.txn_id)
        await service.topics[OUT].buffer.take_snapshot()
        markers = {txn: str(marker) for txn, marker in service.topics[OUT].buffer.aborted.items()}
        path = f"{TX}/transactionBufferStats/public/default/out"
        plain = (await api.get(path)).body
        assert "segmentStats" not in plain["segmentsStats"]
        body = (await api.get(path + "?segmentStats=true&lowWaterMarks=true")).body
        # the second and the fourth abort closed a segment each (aborts are sealed in marker order)
        assert body["segmentsStats"]["segmentStats"] == [
            {"lastTxnID": str(aborted[1]), "persistentPosition": markers[aborted[1]]},
            {"lastTxnID": str(aborted[3]), "persistentPosition": markers[aborted[3]]}]
        assert "lowWaterMarks" in body
        await keeps_to_its_schema(api, "/transactionBufferStats/{tenant}/{namespace}/{topic}", body)
        assert is_json_error(await api.get(path + "?segmentStats=perhaps"), 400)


# --- positionStatsInPendingAck ---------------------------------------------------------------

def position_path(message, subscription: str = "sub", topic: str = "in") -> str:
    mid = message.message_id
    return f"{TX}/positionStatsInPendingAck/public/default/{topic}/{subscription}/{mid.ledger_id}/{mid.entry_id}"


async def state_of(api, message, query: str = "") -> str:
    reply = await api.get(position_path(message) + query)
    assert reply.status == 200, reply
    return reply.body["state"]


async def test_a_committed_ack_moves_from_pending_ack_to_mark_delete(api, client):
    consumer, messages = await messages_on_in(client, 3)
    assert [await state_of(api, m) for m in messages] == ["NotInPendingAck"] * 3
    txn = await client.new_transaction(timeout_ms=600_000)
    await consumer.acknowledge(messages[0], txn=txn)
    assert [await state_of(api, m) for m in messages] == ["PendingAck", "NotInPendingAck", "NotInPendingAck"]
    await keeps_to_its_schema(api, ROUTES["positionStatsInPendingAck"], {"state": "PendingAck"})
    assert await state_of(api, messages[0], "?batchIndex=0") == "PendingAck"
    assert await state_of(api, messages[0], "?batchIndex=1") == "InvalidPosition"   # past its batch size (1)
    await txn.commit()
    assert [await state_of(api, m) for m in messages] == ["MarkDelete", "NotInPendingAck", "NotInPendingAck"]
    assert await state_of(api, messages[0], "?batchIndex=5") == "MarkDelete"


async def test_an_aborted_ack_is_no_longer_pending(api, client):
    consumer, messages = await messages_on_in(client, 3)
    txn = await client.new_transaction(timeout_ms=600_000)
    await consumer.acknowledge(messages[2], txn=txn)
    assert await state_of(api, messages[2]) == "PendingAck"
    await txn.abort()
    assert await state_of(api, messages[2]) == "NotInPendingAck"
    # acknowledged without a transaction, above the mark-delete position: acknowledged too
    await consumer.acknowledge(messages[1])
    assert await state_of(api, messages[1]) == "MarkDelete"


async def test_batch_indexes_held_by_a_transaction(api, client, service):
    _consumer, messages = await messages_on_in(client, 1)
    handle = (await service.get_topic(IN, create=False)).subscriptions["sub"].pending_ack
    txn = await client.new_transaction(timeout_ms=600_000)
    position = Position(messages[0].message_id.ledger_id, messages[0].message_id.entry_id)
    # index 1 of a batch of 4 (Pulsar's ack set: a set bit is an index left free)
    await handle.individual_ack(txn.txn_id, [IndividualAck(position, batch_size=4, ack_set=(0b1101,))])
    states = [await state_of(api, messages[0], f"?batchIndex={i}") for i in range(5)]
    assert states == ["NotInPendingAck", "PendingAck", "NotInPendingAck", "NotInPendingAck", "InvalidPosition"]
    assert await state_of(api, messages[0]) == "PendingAck"                 # some of the entry is held


async def test_entries_under_a_pending_cumulative_ack(api, client):
    consumer, messages = await messages_on_in(client, 3, consumer_type="exclusive")
    txn = await client.new_transaction(timeout_ms=600_000)
    await consumer.acknowledge_cumulative(messages[1], txn=txn)
    assert [await state_of(api, m) for m in messages] == ["PendingAck", "PendingAck", "NotInPendingAck"]
    await txn.commit()
    assert [await state_of(api, m) for m in messages] == ["MarkDelete", "MarkDelete", "NotInPendingAck"]


async def test_pending_acks_not_replayed_are_not_ready(api, client, service):
    _consumer, messages = await messages_on_in(client, 1)
    handle = (await service.get_topic(IN, create=False)).subscriptions["sub"].pending_ack
    handle.state = HandleState.REPLAYING                    # as while the subscription loads
    try:
        assert await state_of(api, messages[0]) == "PendingAckNotReady"
    finally:
        handle.state = HandleState.READY
    assert await state_of(api, messages[0]) == "NotInPendingAck"


async def test_position_stats_refuse_what_pulsar_refuses(api, client):
    _consumer, messages = await messages_on_in(client, 1)
    assert (await api.put("/admin/v2/persistent/public/default/parted/partitions", 2)).status == 204
    base = f"{TX}/positionStatsInPendingAck/public/default"
    for malformed in (("x", "0"), ("0", "x"), ("-1", "0"), ("0", "-1"), (str(2**64), "0"), ("0", "1.5")):
        reply = await api.get(f"{base}/in/sub/{malformed[0]}/{malformed[1]}")
        assert is_json_error(reply, 400), (malformed, reply)
    for query in ("batchIndex=-1", "batchIndex=x", f"batchIndex={2**31}", "batchIndex="):
        assert is_json_error(await api.get(f"{base}/in/sub/0/0?{query}"), 400), query
    assert is_json_error(await api.get(f"{base}/in/nosub/0/0"), 404)
    assert is_json_error(await api.get(f"{base}/nothere/sub/0/0"), 404)
    assert is_json_error(await api.get(f"{base}/parted/sub/0/0"), 404)                # a partitioned topic
    assert is_json_error(await api.get(f"{TX}/positionStatsInPendingAck/public/no/in/sub/0/0"), 404)
    # a position the topic never had is in no pending ack
    assert (await api.get(f"{base}/in/sub/{2**63 - 1}/{2**63 - 1}")).body == {"state": "NotInPendingAck"}


# --- transactionCoordinator/replicas -----------------------------------------------------------

SCALE = f"{TX}/transactionCoordinator/replicas"


async def test_scaling_starts_the_new_coordinators_at_once(api, client, service):
    assert (await api.post(SCALE, 4)).status == 204
    assert service.coordinator.coordinator_ids == [0, 1, 2, 3]
    assert partition_count(service, TC_ASSIGN_TOPIC) == 4                  # what clients discover
    assert service.policies.partitions(TC_ASSIGN_TOPIC) == 4               # durable
    assert set((await api.get(f"{TX}/coordinators")).body) == {"0", "1", "2", "3"}
    stats = (await api.get(f"{TX}/coordinatorStats?coordinatorId=3")).body
    assert stats["state"] == "Ready" and stats["recoverEndTime"] >= stats["recoverStartTime"] > 0
    # the new coordinators serve transactions (the embedded client goes round robin over all)
    coordinators = set()
    producer = await client.create_producer(OUT)
    for _ in range(4):
        txn = await client.new_transaction()
        await producer.send(b"x", txn=txn)
        await txn.commit()
        coordinators.add(txn.txn_id.most_bits)
    assert coordinators == {0, 1, 2, 3}
    assert (await api.get(f"{TX}/coordinatorInternalStats/3")).status == 200
    # only more than there are now
    for fewer in (4, 3, 1, 0, -5):
        assert is_json_error(await api.post(SCALE, fewer), 406), fewer
    assert service.coordinator.coordinator_ids == [0, 1, 2, 3]


async def test_scaling_refuses_malformed_and_absurd_counts(api, service):
    for raw in ("x", "1.5", "true", "null", "[5]", '{"replicas": 5}', str(2**31), "", "5 5"):
        reply = await api.post(SCALE, raw=raw)
        assert is_json_error(reply, 400), (raw, reply)
    assert is_json_error(await api.post(SCALE, 10_001), 406)                 # more than the maximum
    assert is_json_error(await api.get(SCALE), 405)
    assert service.coordinator.coordinator_ids == [0, 1]
    assert service.policies.partitions(TC_ASSIGN_TOPIC) == 2


async def test_concurrent_scalings_end_at_the_larger_count(api, service):
    replies = await asyncio.gather(api.post(SCALE, 3), api.post(SCALE, 4), api.post(SCALE, 4))
    statuses = sorted(reply.status for reply in replies)
    assert statuses in ([204, 204, 406], [204, 406, 406]), replies       # 4 once; 3 only before it
    assert service.coordinator.coordinator_ids == [0, 1, 2, 3]
    assert service.policies.partitions(TC_ASSIGN_TOPIC) == 4


async def test_scaled_coordinators_and_their_transactions_survive_a_restart(tmp_path):
    async with broker(tmp_path / "data", num_coordinators=2) as (service, api, _client):
        assert (await api.post(SCALE, 3)).status == 204
        txn = await service.coordinator.new_transaction(2, 600_000)
    async with broker(tmp_path / "data", num_coordinators=2) as (service, api, _client):
        assert service.coordinator.coordinator_ids == [0, 1, 2]             # never fewer than scaled to
        assert service.coordinator.get(txn).status is TxnStatus.OPEN
        meta = (await api.get(f"{TX}/transactionMetadata/2/{txn.least_bits}")).body
        assert meta["status"] == "OPEN"
        assert is_json_error(await api.post(SCALE, 2), 406)


async def test_scaling_that_would_move_a_transaction_key_is_refused(api, service):
    keys = service.coordinator_v4.keys
    def moved(key: str) -> bool:
        return coordinator_for(ANONYMOUS, key, 2) != coordinator_for(ANONYMOUS, key, 3)

    stays = next(key for key in map(str, range(100)) if not moved(key))
    moves = next(key for key in map(str, range(100)) if moved(key))
    await keys.connect(ANONYMOUS, stays, coordinator_for(ANONYMOUS, stays, 2), NO_EPOCH)
    await keys.connect(ANONYMOUS, moves, coordinator_for(ANONYMOUS, moves, 2), NO_EPOCH)
    reply = await api.post(SCALE, 3)
    assert is_json_error(reply, 409) and repr(moves) in reply.body["reason"]
    assert service.coordinator.coordinator_ids == [0, 1] and service.policies.partitions(TC_ASSIGN_TOPIC) == 2
    # the key still connects where its client computed it
    await keys.connect(ANONYMOUS, moves, coordinator_for(ANONYMOUS, moves, 2), NO_EPOCH)
    # once the moving key is deleted, only the key that stays where it is remains
    assert (await api.delete(f"/admin/v2/transactions/transaction-keys/{moves}")).status == 204
    assert (await api.post(SCALE, 3)).status == 204
    assert service.coordinator.coordinator_ids == [0, 1, 2]
    await keys.connect(ANONYMOUS, stays, coordinator_for(ANONYMOUS, stays, 3), NO_EPOCH)


async def test_a_key_connecting_while_coordinators_are_added_waits_for_them(api, service, monkeypatch):
    # A connect checked against the old number in the middle of a scaling would own a key that
    # then belongs to another coordinator: connects wait until the new coordinators serve.
    v4, keys = service.coordinator.v4, service.coordinator_v4.keys
    moving = [key for key in map(str, range(200))
              if coordinator_for(ANONYMOUS, key, 2) != coordinator_for(ANONYMOUS, key, 3)][:2]
    added, add = asyncio.Event(), v4.add_coordinators

    async def add_when_let(total: int) -> list[int]:
        await added.wait()
        return await add(total)

    monkeypatch.setattr(v4, "add_coordinators", add_when_let)
    scaling = asyncio.ensure_future(api.post(SCALE, 3))
    while service.policies.partitions(TC_ASSIGN_TOPIC) != 3:   # past the check of the keys
        await asyncio.sleep(0.005)
    at_new = asyncio.ensure_future(keys.connect(ANONYMOUS, moving[0], coordinator_for(ANONYMOUS, moving[0], 3),
                                                NO_EPOCH))
    at_old = asyncio.ensure_future(keys.connect(ANONYMOUS, moving[1], coordinator_for(ANONYMOUS, moving[1], 2),
                                                NO_EPOCH))
    await asyncio.sleep(0.05)
    assert not at_new.done() and not at_old.done()
    added.set()
    assert (await scaling).status == 204
    assert await at_new == 0                                   # checked against the 3 now running
    with pytest.raises(NotAllowedError, match="belongs to coordinator"):
        await at_old
    assert [key.key for key in keys.keys()] == [moving[0]]



async def test_a_key_connecting_behind_its_deletion_keeps_the_coordinators_from_growing(api, service, monkeypatch):
    """A new task's connect waits for the key's lock while the key's deletion is written: it
    checked its coordinator against the number then, and takes the key back under it. A scaling
    meanwhile that left the deleted key out owned it to the wrong coordinator (its holder's next
    connect refused): refused until the deletion and the connect are done."""
    keys = service.coordinator_v4.keys
    key = next(k for k in map(str, range(200)) if coordinator_for(ANONYMOUS, k, 2) != coordinator_for(ANONYMOUS, k, 3))
    old = coordinator_for(ANONYMOUS, key, 2)
    await keys.connect(ANONYMOUS, key, old, NO_EPOCH)
    let_go, persist = asyncio.Event(), keys._persist

    async def deletion_held(state):
        if state.deleted:
            await let_go.wait()
        await persist(state)

    monkeypatch.setattr(keys, "_persist", deletion_held)
    deleting = asyncio.ensure_future(keys.delete(ANONYMOUS, key))
    await asyncio.sleep(0.01)
    connecting = asyncio.ensure_future(keys.connect(ANONYMOUS, key, old, NO_EPOCH))    # its new task
    await asyncio.sleep(0.01)
    reply = await api.post(SCALE, 3)
    assert is_json_error(reply, 409) and repr(key) in reply.body["reason"]
    let_go.set()
    await deleting
    epoch = await connecting
    assert await keys.connect(ANONYMOUS, key, old, epoch) == epoch + 1        # its holder reconnects
    assert service.coordinator.coordinator_ids == [0, 1]

# --- the OpenAPI document and the command line ---------------------------------------------------

async def test_the_new_routes_are_in_the_openapi_document(api):
    paths = (await api.get("/openapi.json")).body["paths"]
    for route in ROUTES.values():
        assert "get" in paths[TX + route], route
    assert paths[TX + "/transactionCoordinator/replicas"]["post"]["requestBody"]["required"] is True
    buffer_params = {p["name"] for p in paths[TX + "/transactionBufferStats/{tenant}/{namespace}/{topic}"]["get"]
                     ["parameters"]}
    assert {"lowWaterMarks", "segmentStats"} <= buffer_params
    position_params = {p["name"] for p in paths[TX + ROUTES["positionStatsInPendingAck"]]["get"]["parameters"]}
    assert "batchIndex" in position_params


async def test_the_command_line(admin, client, service):
    consumer, messages = await messages_on_in(client, 2)
    txn = await client.new_transaction(timeout_ms=600_000)
    await consumer.acknowledge(messages[0], txn=txn)
    cid = str(txn.txn_id.most_bits)
    status, body, _ = await admin("transactions", "coordinator-internal-stats", "-c", cid, "-m")
    assert status == 0 and log_of(body, "transactionLogStats")[1] >= 1
    status, body, _ = await admin("transactions", "pending-ack-internal-stats", IN, "-s", "sub")
    assert status == 0 and log_of(body, "pendingAckLogStats")[1] == 1
    mid = messages[0].message_id
    args = ("transactions", "position-stats-in-pending-ack", IN, "-s", "sub", "-l", str(mid.ledger_id),
            "-e", str(mid.entry_id))
    assert (await admin(*args))[1] == {"state": "PendingAck"}
    assert (await admin(*args, "-b", "3"))[1] == {"state": "InvalidPosition"}
    await txn.commit()
    assert (await admin(*args))[1] == {"state": "MarkDelete"}
    status, body, _ = await admin("transactions", "transaction-buffer-internal-stats", "out")
    assert status == 1 and body is None                                     # no snapshot of `out`
    producer = await client.create_producer(OUT)
    txn = await client.new_transaction()
    await producer.send(b"x", txn=txn)
    await txn.commit()
    await service.topics[OUT].buffer.take_snapshot()
    assert (await admin("transactions", "buffer-internal-stats", "out"))[1]["snapshotType"] == "Segment"
    stats = (await admin("transactions", "buffer-stats", "out", "--segment-stats"))[1]
    assert stats["segmentsStats"]["segmentStats"] == []
    status, _, err = await admin("transactions", "scale-transactionCoordinators", "-r", "2")
    assert status == 1 and err.startswith("error: HTTP 406: ")
    assert await admin("transactions", "scale-transactionCoordinators", "-r", "3") == (0, None, "")
    assert service.coordinator.coordinator_ids == [0, 1, 2]
