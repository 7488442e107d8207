"""`GET /admin/v3/transactions/transactionBufferStats/...` also tells where the buffer's last
snapshot stands (`lastSnapshotPosition`) and how many entries its last recovery replayed
(`recoverReplayedEntries`): Pulsar's TransactionBufferStats has neither, so they are named
after what they say. Checked across a broker restart, with snapshots and without, on v4 and
v5 buffers, and against the route's OpenAPI schema."""

from __future__ import annotations


from pyengine.broker.embedded import EmbeddedClient
from pyengine.transaction.buffer.config import TopicTransactionBufferConfig
from pyengine_kernels import Position
from tests.admin.conftest import restartable_broker

OUT = "persistent://public/default/out"
STATS = "/admin/v3/transactions/transactionBufferStats/public/default/out"
ROUTE = "/admin/v3/transactions/transactionBufferStats/{tenant}/{namespace}/{topic}"


broker = restartable_broker


async def send_committed(client: EmbeddedClient, payload: bytes) -> None:
    producer = await client.create_producer(OUT)
    txn = await client.new_transaction()
    await producer.send(payload, txn=txn)
    await txn.commit()
    await producer.close()


async def test_the_last_snapshot_position_is_reported_and_survives_a_restart(tmp_path):
    async with broker(tmp_path / "data") as (service, api, client):
        await send_committed(client, b"a")
        assert (await api.get(STATS)).body["recoverReplayedEntries"] == 0     # a new topic: nothing to replay
        await service.topics[OUT].buffer.take_snapshot()
        figures = (await api.get(STATS)).body
        assert figures["lastSnapshotPosition"] == figures["maxReadPosition"]
        assert figures["lastSnapshotTimestamps"] > 0
        await send_committed(client, b"b")
        saved_at_close = (await api.get(STATS)).body["maxReadPosition"]
    async with broker(tmp_path / "data") as (service, api, client):
        await service.get_topic(OUT)
        figures = (await api.get(STATS)).body
        # the snapshot written at close: recovery starts after it, with nothing to replay
        assert figures["lastSnapshotPosition"] == saved_at_close
        assert figures["recoverReplayedEntries"] == 0


async def test_recovery_without_snapshots_reports_every_entry_it_replayed(tmp_path):
    no_snapshots = TopicTransactionBufferConfig(snapshots_enabled=False)
    async with broker(tmp_path / "data", transaction_buffer=no_snapshots) as (service, api, client):
        await send_committed(client, b"a")
        await send_committed(client, b"b")
        ledger = service.topics[OUT].ledger
        stored = len(ledger.read_entries(Position.EARLIEST, 1000, ledger.lac))
    assert stored >= 4                                            # 2 messages, 2 commit markers
    async with broker(tmp_path / "data", transaction_buffer=no_snapshots) as (service, api, client):
        await service.get_topic(OUT)
        figures = (await api.get(STATS)).body
        assert figures["lastSnapshotPosition"] is None
        assert figures["recoverReplayedEntries"] == stored


async def test_a_v5_buffer_reports_no_snapshot_and_no_replay(tmp_path):
    async with broker(tmp_path / "data") as (service, api, client):
        await service.policies.create_namespace("public/v5")
        assert (await api.post("/admin/v2/namespaces/public/v5/transactionVersion", 5)).status == 204
        producer = await client.create_producer("persistent://public/v5/out")
        txn = await client.new_transaction(version=5)
        await producer.send(b"x", txn=txn)
        reply = await api.get("/admin/v3/transactions/transactionBufferStats/public/v5/out")
        assert reply.status == 200, reply
        assert reply.body["ongoingTxnSize"] == 1
        assert reply.body["lastSnapshotPosition"] is None and reply.body["recoverReplayedEntries"] == 0
        await txn.abort()


async def test_segmented_snapshots_are_reported_as_pulsar_names_them(tmp_path):
    """PIP-196's segment stats (Pulsar's `snapshotType` and `segmentsStats`), across a restart."""
    config = TopicTransactionBufferConfig(snapshot_segment_aborts=3)
    async with broker(tmp_path / "data", transaction_buffer=config) as (service, api, client):
        producer = await client.create_producer(OUT)
        for _ in range(7):
            txn = await client.new_transaction()
            await producer.send(b"x", txn=txn)
            await txn.abort()
        await service.topics[OUT].buffer.take_snapshot()
        figures = (await api.get(STATS)).body
        assert figures["snapshotType"] == "Segment" and figures["totalAbortedTransactions"] == 7
        segments = figures["segmentsStats"]
        assert (segments["segmentsSize"], segments["unsealedAbortTxnIDSize"], segments["currentSegmentCapacity"]) \
            == (2, 1, 3)
        assert segments["lastTookSnapshotSegmentTimestamp"] > 0
    async with broker(tmp_path / "data", transaction_buffer=config) as (service, api, client):
        await send_committed(client, b"loads the topic")
        segments = (await api.get(STATS)).body["segmentsStats"]
        assert (segments["segmentsSize"], segments["unsealedAbortTxnIDSize"]) == (2, 1)
        assert segments["lastTookSnapshotSegmentTimestamp"] == 0         # sealed by the previous run


async def test_the_openapi_schema_describes_every_field_served(tmp_path):
    async with broker(tmp_path / "data") as (_service, api, client):
        await send_committed(client, b"a")
        schema = (await api.get("/openapi.json")).body["paths"][ROUTE]["get"]["responses"]["200"][
            "content"]["application/json"]["schema"]
        figures = (await api.get(f"{STATS}?lowWaterMarks=true")).body
    properties = schema["properties"]
    assert properties["lastSnapshotPosition"]["type"] == "string" and properties["lastSnapshotPosition"]["nullable"]
    assert properties["recoverReplayedEntries"]["type"] == "integer"
    assert {"lastSnapshotPosition", "recoverReplayedEntries"} <= set(schema["required"])
    assert set(figures) <= set(properties) and set(schema["required"]) <= set(figures)
