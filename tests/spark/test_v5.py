"""v5 (PIP-473) topics in the data source, beyond the shared workload: decisions the segments
have not applied yet, late writes the buffer had no time to record, a namespace whose policy
makes `persistent://` topics v5, and data dirs whose broker kept the v5 state in etcd.

No Spark here but the one read that shows the etcd refusal reaches Spark's caller: the
rows come from the data source's own reader (`PyengineReader.partitions()` / `read()`, what
Spark runs in its Python workers), and the oracle is a broker reopened on the data dir.
"""

from __future__ import annotations

import asyncio

import pytest
from pyspark.errors import PySparkException

from pyengine.broker import Broker
from pyengine.broker.policies import NamespacePolicies
from pyengine.cli import main
from pyengine.metadata.lmdb_store import LmdbMetadataStore
from pyengine.protocol.commands import message_metadata
from pyengine.storage import ManagedLedger, StorageEnvironment
from pyengine.storage.entry import headers_and_payload
from pyengine.transaction import TxnAction
from pyengine.transaction.coordinator.metadata_coordinator import MetadataTransactionCoordinator
from pyengine.transaction.coordinator.metadata_records import OpRecord, op_prefix, txn_key
from pyengine_kernels import Position
from spark_udfs.options import OptionError, resolve_topics
from spark_udfs.state import MetadataBackendError, capture_state
from tests.metadata.conftest import etcd_server  # noqa: F401  (fixture)
from tests.spark.workload import consume_all, read_directly

SEGMENT = "segment://public/default/late/0000-ffff-0"
V5_PERSISTENT = "persistent://acme/v5/orders"        # v5 by its namespace's policy


def source_rows(data_dir, **options) -> list[tuple[str, Position, bytes]]:
    """What `spark.read.format("pyengine")` returns, read by the source's reader itself."""
    return sorted((r["topic"], Position(r["ledger_id"], r["entry_id"]), r["value"])
                  for r in read_directly(data_dir, **options).to_pylist())


async def consumer_rows(broker, topics) -> list[tuple[str, Position, bytes]]:
    def row(topic, message):
        return topic, Position(message.message_id.ledger_id, message.message_id.entry_id), message.data

    return sorted(await consume_all(broker, topics, row, quiet=0.3))


async def write(data_dir) -> dict[str, object]:
    """Per topic: txn `a` (committed later, offline), `b` (aborted later, offline), `c` (left
    open), `d` (committed now, through the broker), with plain messages between them."""
    txns = {}
    async with Broker.embedded(data_dir, sync=False) as broker:
        await broker.service.policies.create_tenant("acme")
        await broker.service.policies.create_namespace("acme/v5", NamespacePolicies(transaction_version=5))
        for name in "abcd":
            txns[name] = await broker.new_transaction(version=5)
        for topic in (SEGMENT, V5_PERSISTENT):
            producer = await broker.create_producer(topic)
            for name in ("plain", "a", "b", "d", "plain", "c", "a", "plain"):
                txn = txns.get(name)
                await producer.send(f"{name}@{topic}".encode(), txn=txn)
        assert type(broker.service.topics[V5_PERSISTENT].buffer).__name__ == "MetadataTransactionBuffer"
        await txns["d"].commit()
    return {name: txn.txn_id for name, txn in txns.items()}


async def decide_offline(data_dir, txns) -> None:
    """The coordinator decides `a` and `b` while no broker serves the topics: the decisions are
    in the headers only (no participant applied them). Then a write of `a` lands after its
    commit, as a broker that crashed mid-way through refusing it leaves it: entry and op
    record, no hidden-position property yet."""
    env = StorageEnvironment(data_dir, sync=False)
    store = await LmdbMetadataStore(env).start()
    coordinator = MetadataTransactionCoordinator(store)
    await coordinator.start(sweep=False)
    await coordinator.end_transaction(txns["a"], TxnAction.COMMIT)
    await coordinator.end_transaction(txns["b"], TxnAction.ABORT)
    ledger = await ManagedLedger.open(env, SEGMENT)
    meta = message_metadata("late", 99, 1, txnid_most_bits=txns["a"].most_bits,
                            txnid_least_bits=txns["a"].least_bits).SerializeToString()
    position, durable = ledger.append_entry(headers_and_payload(meta, b"late-a"), txn_most=txns["a"].most_bits,
                                            txn_least=txns["a"].least_bits)
    await store.put(op_prefix(txns["a"]), OpRecord("write", SEGMENT, position).encode(), sequential=True,
                    partition_key=txn_key(txns["a"]))
    await durable
    await ledger.close()
    await coordinator.close()
    await store.close()
    env.close()


async def reopened_consumers(data_dir) -> list:
    async with Broker.embedded(data_dir, sync=False) as broker:
        return await consumer_rows(broker, (SEGMENT, V5_PERSISTENT))


def test_decisions_not_applied_yet_and_a_late_write_left_by_a_crash(tmp_path):
    data_dir = tmp_path / "data"
    txns = asyncio.run(write(data_dir))
    asyncio.run(decide_offline(data_dir, txns))
    state = capture_state(data_dir)
    assert {name: s.design for name, s in state.topics.items()} == {SEGMENT: 5, V5_PERSISTENT: 5}
    segment = state[SEGMENT]
    assert {t for t, _ in segment.aborted_set().items()} == {txns["b"]}
    assert [t for t, _ in segment.ongoing] == [txns["c"]]
    late = segment.hidden
    assert len(late) == 1 and late[0] == segment.last_position
    rows = source_rows(data_dir)
    values = [value for _topic, _position, value in rows]
    for topic in (SEGMENT, V5_PERSISTENT):
        # Up to the open `c`: plain, a, d (b aborted); `a`'s second write waits behind `c`.
        assert [v.decode().split("@")[0] for t, _p, v in rows if t == topic] == ["plain", "a", "d", "plain"]
    assert b"late-a" not in values
    # The broker, reopened, applies the same decisions (it recovers from the same records).
    # Its one difference is the late write a crash left unrecorded: behind the open `c` here,
    # so no consumer can see it either way.
    assert asyncio.run(reopened_consumers(data_dir)) == rows


def test_v5_topics_of_a_broker_with_an_etcd_metadata_store_are_refused(tmp_path, etcd_server, spark):  # noqa: F811
    data_dir = tmp_path / "data"

    async def produce() -> None:
        url = f"etcd://{etcd_server.host}:{etcd_server.port}"
        async with Broker.embedded(data_dir, sync=False, metadata_store=url) as broker:
            await broker.service.get_topic(SEGMENT)     # as its controller would (etcd: a cluster's)
            producer = await broker.create_producer(SEGMENT)
            txn = await broker.new_transaction(version=5)
            await producer.send(b"in-txn", txn=txn)
            await txn.commit()
            await producer.send(b"plain")

    asyncio.run(produce())
    message = "LMDB metadata store of .* has never been written: the broker ran with another metadata store"
    with pytest.raises(MetadataBackendError, match=message):
        capture_state(data_dir)
    with pytest.raises(PySparkException, match="ran with another metadata store"):
        spark.read.format("pyengine").load(str(data_dir)).count()
    with pytest.raises(SystemExit, match="ran with another metadata store"):
        main(["pipeline", "export", "--data-dir", str(data_dir), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
    # READ_UNCOMMITTED needs no transaction state: every stored message.
    assert [v for _t, _p, v in source_rows(data_dir, isolation="read_uncommitted")] == [b"in-txn", b"plain"]


def test_topic_selection_names_segments():
    stored = ["persistent://public/default/a", "segment://public/default/s/0000-7fff-1",
              "segment://public/default/s/8000-ffff-2", "segment://public/default/t/0000-ffff-0"]
    assert resolve_topics(("topic://public/default/s",), stored) == stored[1:3]
    assert resolve_topics(("public/default",), stored) == stored
    assert resolve_topics(("segment://public/default/s/*",), stored) == stored[1:3]
    assert resolve_topics(("segment://public/default/t/0000-FFFF-0",), stored) == stored[3:]
    assert resolve_topics(("public/default/*",), stored) == stored[:1]          # persistent:// unless named
    for patterns, message in [(("topic://public/default/nope",), "has no stored segment"),
                              (("segment://public/default/s/0000-7fff-9",), "unknown topic"),
                              (("segment://public/default/s/zz",), "invalid segment descriptor")]:
        with pytest.raises(OptionError, match=message):
            resolve_topics(patterns, stored)
