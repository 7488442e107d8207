"""Three brokers on one etcd (each its own data dir): a v5 transaction started on one broker
writes to segments and acks on a subscription owned by the two others; its commit (one CAS on
the third) reaches them through their own header watches. Ids never collide across brokers,
and every broker's sweeps may run at once: each expired txn is aborted exactly once, and GC
leaves nothing behind."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

from pyengine.broker import Broker
from pyengine.metadata.etcd_store import EtcdMetadataStore
from pyengine.transaction import TxnAction, TxnStatus
from tests.metadata.conftest import etcd_server  # noqa: F401  (fixture)

from .conftest import eventually

S1 = "segment://public/default/cluster/0000-7fff-1"
S2 = "segment://public/default/cluster/8000-ffff-2"


def visible(topic) -> list[bytes]:
    from pyengine.client.message import decode_entry
    from pyengine_kernels import Position

    horizon = topic.buffer.max_read_position()
    out = []
    for entry in topic.ledger.read_entries(Position.EARLIEST, 10**6, horizon):
        if not entry.is_marker and not topic.buffer.hides(entry):
            out.extend(m.data for m in decode_entry(topic.name, entry.position, bytes(entry.data)))
    return out


async def test_three_brokers_share_v5_transactions(etcd_server, tmp_path):
    root = f"/cluster-{uuid.uuid4().hex[:8]}"
    async with contextlib.AsyncExitStack() as stack:
        brokers = []
        for i in range(3):
            store = await EtcdMetadataStore(etcd_server.host, etcd_server.port, root=root).start()
            stack.push_async_callback(store.close)
            brokers.append(await stack.enter_async_context(Broker.embedded(
                tmp_path / f"b{i}", sync=False, broker_id=str(i), metadata_store=store, txn_v5_retention_ms=0,
                txn_v5_sweep_interval_ms=50)))
        a, b, c = brokers
        # a segment of a broker sharing its metadata store is made by its controller (the
        # embedding API attaches to existing ones only): as its segment operations make it
        await a.service.get_topic(S1)
        await b.service.get_topic(S2)
        on_a = await a.create_producer(S1)
        on_b = await b.create_producer(S2)
        consumer = await a.subscribe(S1, "sub", consumer_type="shared", initial_position="earliest")
        first = await on_a.send(b"plain")
        got = await consumer.receive(timeout=5)

        txn = await c.new_transaction(timeout_ms=60_000, version=5)
        # the participants write their own op records; the txn is the same id on every broker
        a_txn = type(txn)(a.service, txn.txn_id)
        b_txn = type(txn)(b.service, txn.txn_id)
        await on_a.send(b"t-a", txn=a_txn)
        await on_b.send(b"t-b", txn=b_txn)
        await consumer.acknowledge(got, txn=a_txn)
        topic_a, topic_b = a.service.topics[S1], b.service.topics[S2]
        assert visible(topic_a) == [b"plain"] and visible(topic_b) == []
        assert await c.service.coordinator.end_transaction(txn.txn_id, TxnAction.COMMIT) is TxnStatus.COMMITTED
        await eventually(lambda: visible(topic_a) == [b"plain", b"t-a"] and visible(topic_b) == [b"t-b"])
        await eventually(lambda: topic_a.subscriptions["sub"].cursor.is_acked(first.position))

        # ids from three coordinators never collide; all three sweep concurrently
        txns = await asyncio.gather(*[broker.new_transaction(timeout_ms=200, version=5)
                                      for broker in brokers for _ in range(10)])
        assert len({t.txn_id for t in txns}) == 30
        timed_out_before = sum(br.service.v5.coordinator.stats()["timed_out_total"] for br in brokers)
        store = a.service.metadata

        async def headers_left() -> int:
            return len(await store.list_prefix("/txn/"))

        for _ in range(300):
            if await headers_left() == 0 and not await store.list_prefix("/txn-op/"):
                break
            await asyncio.sleep(0.02)
        assert await headers_left() == 0
        assert len(await store.list_prefix("/txn-op/")) == 0

        def timed_out() -> int:
            return sum(br.service.v5.coordinator.stats()["timed_out_total"] for br in brokers) - timed_out_before

        # A broker counts its abort when the CAS's answer reaches it, which can be after another
        # broker's GC deleted the header: wait for the counts, then check none came twice.
        await eventually(lambda: timed_out() >= 30)
        await asyncio.sleep(0.2)
        assert timed_out() == 30                # each aborted exactly once, whichever broker did it
