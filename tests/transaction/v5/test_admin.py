"""v5 transactions through the admin API: a txn's metadata (from its header), the force-abort,
and the transaction-buffer stats of a segment (the v4 keys, no snapshots)."""

from __future__ import annotations

from pyengine.admin import stats
from pyengine.transaction.coordinator.metadata_records import V5_COORDINATOR_ID
from tests.admin.conftest import api, client, server, service  # noqa: F401  (fixtures)

SEGMENT = "segment://public/default/admin/0000-ffff-0"
BASE = "/admin/v3/transactions"


async def test_v5_transaction_metadata_and_force_abort(api, client, service):
    producer = await client.create_producer(SEGMENT)
    txn = await client.new_transaction(timeout_ms=30_000, version=5)
    await producer.send(b"x", txn=txn)
    most, least = txn.txn_id.most_bits, txn.txn_id.least_bits
    reply = await api.get(f"{BASE}/transactionMetadata/{most}/{least}")
    assert reply.status == 200, reply
    assert reply.body["status"] == "OPEN" and reply.body["timeoutAt"] == 30_000
    assert (await api.post(f"{BASE}/abortTransaction/{most}/{least}")).status in (200, 204)
    reply = await api.get(f"{BASE}/transactionMetadata/{most}/{least}")
    assert reply.body["status"] == "ABORTED"
    assert (await api.get(f"{BASE}/transactionMetadata/{V5_COORDINATOR_ID}/999999")).status == 404
    figures = stats.buffer_stats(service.topics[SEGMENT], True)
    assert figures["lastSnapshotTimestamps"] == 0 and figures["lowWaterMarks"] == {}
    assert figures["recoverEndTime"] >= figures["recoverStartTime"] > 0


async def test_v5_coordinator_stats(api, client):
    path = f"{BASE}/coordinatorStats?coordinatorId={V5_COORDINATOR_ID}"
    assert (await api.get(path)).body["ongoingTxnSize"] == 0
    txns = [await client.new_transaction(version=5) for _ in range(3)]
    reply = await api.get(path)
    assert reply.status == 200 and reply.body == {"state": "Ready", "leastSigBits": -1, "lowWaterMark": -1,
                                                  "ongoingTxnSize": 3}
    await txns[0].commit()
    assert (await api.get(path)).body["ongoingTxnSize"] == 2
    # Not among every coordinator's: Pulsar's admin client reads those keys as Java ints.
    assert str(V5_COORDINATOR_ID) not in (await api.get(f"{BASE}/coordinatorStats")).body
