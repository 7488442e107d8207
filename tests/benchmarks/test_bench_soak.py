"""The soak suite (`python -m benchmarks soak`): a short run with broker kills and delayed END_TXN
finds no anomaly, and the END_TXN delay proxy's scenario (a commit arriving after the
transaction timed out) is refused by the broker, nothing of the transaction becomes visible."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace

from benchmarks import bench_soak
from benchmarks.history import COMMIT, OK, SEND, History, check
from pyengine.client import Client, MessageId
from pyengine.testing import ServeProcess


def test_figures_are_the_issues():
    assert [f.name for f in bench_soak.FIGURES] == [
        "anomalies", "txns_committed", "txns_aborted", "txns_unknown", "kills", "values_read", "transfer_txns_committed"]
    anomalies = bench_soak.FIGURES[0]
    assert anomalies.target is not None and anomalies.target.met(0) and not anomalies.target.met(1)


def test_a_send_answered_as_a_duplicate_has_no_acknowledged_id():
    """A resend after a broker kill, found stored already by de-duplication, is answered with
    (-1, -1): recorded as that id, it sorted before the transaction's earlier sends and the
    checker reported the transaction's values stored out of send order (a CI soak, seed
    1595298241)."""
    assert bench_soak.acknowledged_id(MessageId(-1, -1, -1)) is None
    assert bench_soak.acknowledged_id(MessageId(3, 7, -1)) == (3, 7, -1)
    h = History()
    for value, msg_id in (("v1", (3, 7, -1)), ("v2", None), ("v3", (3, 9, -1))):
        h.invoke("w", SEND, txn="t", topic="a", value=value)
        h.complete("w", SEND, OK, txn="t", topic="a", value=value, msg_id=msg_id)
    h.invoke("w", COMMIT, txn="t")
    h.complete("w", COMMIT, OK, txn="t")
    assert check(h.ops).valid
    h.ops[3] = replace(h.ops[3], msg_id=(-1, -1, -1))        # as recorded before
    assert "non_contiguous" in check(h.ops).found()


async def test_a_short_soak_finds_no_anomaly(tmp_path):
    seed = random.randrange(2**32)
    result, info = await bench_soak.soak(25, tmp_path, seed=seed, kill_pause=(3.0, 7.0))
    assert result.valid, f"seed {seed}: {result.summary()}"
    figures = bench_soak.figures_of(result, info)
    assert figures["kills"] >= 1 and figures["txns_committed"] > 0 and figures["txns_aborted"] > 0
    assert figures["values_read"] > 0
    assert figures["transfer_txns_committed"] > 0 and info["transfer"].count == 0, info["transfer"].summary()
    assert info["transfer"].stats["outputs"] > 0
    # the checker is not vacuous on a real history: one committed value's read dropped is found
    history = info["history"].ops
    committed = {op.txn for op in history if op.f == "commit" and op.type == "ok"}
    txn_of = {op.value: op.txn for op in history if op.f == "send" and op.type == "invoke"}
    victim = next(op for op in history if op.f == "read" and txn_of.get(op.value) in committed)
    assert check([op for op in history if op is not victim]).found() & {"lost_write", "torn_transaction"}
    # nor are the real-time checks: a Reader's message received again, a send stored at an id
    # read before it was invoked
    readers = {(op.process, op.topic) for op in history if op.f == "opened" and op.value == "non_durable"}
    assert {(p, t) for p in ("r1", "r2") for t in {op.topic for op in history if op.f == "read"}} <= readers
    again = next(op for op in history if op.f == "read" and op.process == "r1")
    assert "nonmonotonic_read" in check([*history, replace(again, index=len(history) + 1)]).found()
    first_read = next(op for op in history if op.f == "read")
    later = next(op for op in history if op.f == "send" and op.type == "ok" and op.msg_id is not None
                 and op.topic == first_read.topic and op.index > first_read.index + 1)
    assert "nonmonotonic_send" in check([replace(op, msg_id=first_read.msg_id) if op is later else op
                                         for op in history]).found()


async def test_a_commit_delayed_past_the_txn_timeout_is_refused_and_invisible(tmp_path):
    with ServeProcess(tmp_path / "data") as broker:
        proxy = await bench_soak.EndTxnDelayProxy(broker.port, random.Random(0)).start()
        proxy.delay = lambda: 2.0                      # every END_TXN lands 2 s late
        topic = "persistent://public/default/late-commit"
        try:
            async with Client(f"pulsar://127.0.0.1:{proxy.port}", operation_timeout_seconds=10) as client:
                bench_soak.through_proxy(client, proxy)
                producer = await client.create_producer(topic)
                late = await client.new_transaction(timeout_ms=1500)    # < the 2 s delay
                await producer.send(b"late", txn=late)
                try:
                    await late.commit()                # sent in time, arrives after the timeout
                except Exception as exc:
                    refused = exc
                else:
                    refused = None
                ok = await client.new_transaction(timeout_ms=30_000)
                await producer.send(b"ok", txn=ok)
                await ok.commit()                      # 2 s late too, but within its timeout
            assert refused is not None, "a commit arriving after the transaction's timeout was accepted"
            async with Client(broker.url) as reader_client:
                reader = await reader_client.create_reader(topic, MessageId.earliest)
                seen = [(await reader.receive(5)).data]
                while await reader.has_message_available():
                    seen.append((await reader.receive(5)).data)
            assert seen == [b"ok"]
            assert proxy.delayed == 2
        finally:
            await proxy.close()
