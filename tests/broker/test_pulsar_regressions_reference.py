"""More Apache Pulsar (and Kafka) transaction bugs the broker avoids, one test each, named by the
row of reference/anchors-and-failure-modes.md section B they come from (the first batch is in
test_pulsar_regressions.py)."""

import time

import pytest

from pyengine.admin import stats
from pyengine.broker import Broker
from pyengine.broker.service import BrokerConfig, BrokerService
from pyengine.client import Client
from pyengine.protocol.server import ProtocolServer
from pyengine.storage import StorageError
from tests.broker.helpers import drain, publish_batch

T = "persistent://public/default/regression-reference"


async def test_kafka_lag_stuck_at_1_a_commit_marker_last_leaves_no_backlog(tmp_path):
    """spring-kafka #1587, kafka4s #684: after a committed transaction the consumer lag stayed
    at 1 for good: the commit marker is the last offset and is never delivered, so nothing
    acknowledges it. Here, with the marker as the topic's last entry, acking every message
    leaves no backlog and moves the subscription past the marker (individual and cumulative
    acks, batched or not, also after a restart)."""
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        shared = await broker.subscribe(T, "shared", consumer_type="shared", initial_position="earliest")
        exclusive = await broker.subscribe(T, "exclusive", initial_position="earliest")
        for batched in (False, True):
            txn = await broker.new_transaction()
            if batched:
                await publish_batch(broker, producer, [b"b0", b"b1", b"b2"], txn=txn)
            else:
                await producer.send(b"single", txn=txn)
            await txn.commit()
        topic = broker.service.topics[T]
        assert topic.ledger.read_entry(topic.ledger.lac).is_marker
        for message in await drain(shared):
            await shared.acknowledge(message)
        received = await drain(exclusive)
        assert [m.data for m in received] == [b"single", b"b0", b"b1", b"b2"]
        await exclusive.acknowledge_cumulative(received[-1])
        for name in ("shared", "exclusive"):
            subscription = topic.subscriptions[name]
            assert subscription.backlog() == 0, name
            assert subscription.cursor.mark_delete == topic.ledger.lac, name
    async with Broker.embedded(tmp_path) as broker:
        await broker.subscribe(T, "shared", consumer_type="shared")
        assert broker.service.topics[T].subscriptions["shared"].backlog() == 0


async def test_pip_251_transaction_buffer_stats_show_the_snapshot_state(tmp_path):
    """PIP-251 (#19628, #20291): operators could not see a transaction buffer's snapshot state.
    Here the admin TransactionBufferStats give the time of the last snapshot (0: none yet), the
    aborted txns it keeps, the open ones and the read horizon, and the recovery's start and end
    after a restart."""
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        await producer.send(b"plain")
        topic = broker.service.topics[T]
        figures = stats.buffer_stats(topic, True)
        assert figures["lastSnapshotTimestamps"] == 0            # never transactional: no snapshot
        assert figures["state"] == "Ready" and figures["maxReadPosition"] == str(topic.ledger.lac)
        before_first = int(time.time() * 1000)
        for commit in (False, True):
            txn = await broker.new_transaction()
            await producer.send(b"t", txn=txn)
            await (txn.commit() if commit else txn.abort())
        still_open = await broker.new_transaction()
        held = await producer.send(b"open", txn=still_open)
        await topic.buffer.take_snapshot()
        figures = stats.buffer_stats(topic, True)
        assert figures["lastSnapshotTimestamps"] >= before_first
        assert figures["totalAbortedTransactions"] == 1 and figures["ongoingTxnSize"] == 1
        assert figures["maxReadPosition"] == f"{held.ledger_id}:{held.entry_id - 1}"
        assert "lowWaterMarks" in figures
        await still_open.abort()
        stopped = int(time.time() * 1000)
    async with Broker.embedded(tmp_path) as broker:
        await broker.create_producer(T)
        figures = stats.buffer_stats(broker.service.topics[T], False)
        assert figures["state"] == "Ready" and figures["totalAbortedTransactions"] == 2
        assert stopped <= figures["lastSnapshotTimestamps"]     # the snapshot of the clean stop
        assert stopped <= figures["recoverStartTime"] <= figures["recoverEndTime"]


async def network_broker(data_dir) -> tuple[BrokerService, ProtocolServer]:
    service = BrokerService(BrokerConfig(data_dir=data_dir, sync=False, num_coordinators=1))
    await service.start()
    server = ProtocolServer(service, "127.0.0.1", 0)
    await server.start()
    return service, server


async def test_11772_a_pending_ack_store_that_cannot_be_opened_fails_the_subscribe_at_once(tmp_path, monkeypatch):
    """#11772 (and #13654): opening a subscription's pending-ack store failed and the broker
    never answered the subscribe: the client timed out with nothing to go on. Here the broker
    answers at once with the cause, both when the store of a new subscription cannot be opened
    and when the pending acks of an existing one cannot be replayed after a restart. (The
    client retries such an answer until its operation timeout, as the Java client retries a
    BrokerPersistence or ServiceNotReady error, and then raises it: within 1 s here.) The next
    subscribe after the fault works."""
    service, server = await network_broker(tmp_path / "data")
    try:
        real = service.new_pending_ack_handle

        def store_that_cannot_open(*args, **kwargs):
            raise StorageError("cannot open the pending-ack log: disk full")

        monkeypatch.setattr(service, "new_pending_ack_handle", store_that_cannot_open)
        async with Client(f"pulsar://127.0.0.1:{server.port}", operation_timeout_seconds=1) as client:
            producer = await client.create_producer(T)
            await producer.send(b"m")
            started = time.monotonic()
            with pytest.raises(TimeoutError, match="cannot open the pending-ack log: disk full"):
                await client.subscribe(T, "s", initial_position="earliest")
            assert time.monotonic() - started < 11     # its 1 s, not the default 30 s (2: load)
            monkeypatch.setattr(service, "new_pending_ack_handle", real)
            consumer = await client.subscribe(T, "s", initial_position="earliest")
            message = await consumer.receive(timeout=2)
            txn = await client.new_transaction()
            await consumer.acknowledge(message, txn=txn)        # a pending ack left for the restart
    finally:
        await server.stop()
        await service.close()

    service, server = await network_broker(tmp_path / "data")
    try:
        env = service.env
        with env.read() as read:
            keys = [key for key, _ in read.cursor(db=env.db("pending_ack"))]
        assert len(keys) == 1
        await env.submit(lambda txn: txn.put(keys[0], b"\xff\xff\xff", db=env.db("pending_ack")))
        async with Client(f"pulsar://127.0.0.1:{server.port}", operation_timeout_seconds=1) as client:
            started = time.monotonic()
            with pytest.raises(TimeoutError, match="regression-reference/s: record 0 cannot be decoded"):
                await client.subscribe(T, "s")
            assert time.monotonic() - started < 11     # its 1 s, not the default 30 s (2: load)
            await env.submit(lambda txn: txn.delete(keys[0], db=env.db("pending_ack")))
            consumer = await client.subscribe(T, "s")
            assert (await consumer.receive(timeout=2)).data == b"m"
    finally:
        await server.stop()
        await service.close()
