"""kill -9 of a v5 broker process (crash_child.py) mid-materialisation — after the buffer or the
pending acks applied a decision, before they deleted their op records — and of the
coordinator between its header CAS and the client's answer. A broker restarted on the data
dir must finish every materialisation (idempotent), keep every decision, show exactly the
committed messages, apply exactly the committed acks, and after GC leave zero op records and
zero headers of finished transactions."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pyengine.broker import Broker
from pyengine.client.message import decode_entry
from pyengine.errors import InvalidTxnStatusError
from pyengine.transaction import TxnAction, TxnStatus
from pyengine.transaction.coordinator.metadata_records import V5_COORDINATOR_ID, HeaderState
from pyengine_kernels import Position, TxnId
from tests.transaction.v5.crash_child import SEGMENT, SUB

from .conftest import eventually

ROOT = Path(__file__).resolve().parents[3]


def run_child(data_dir: Path, seed: int, kill_point: str) -> list[str]:
    result = subprocess.run([sys.executable, "-m", "tests.transaction.v5.crash_child", str(data_dir), str(seed),
                             kill_point], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == -signal.SIGKILL, (result.returncode, result.stderr[-3000:])
    return result.stdout.splitlines()


def visible_labels(topic) -> set[bytes]:
    horizon = topic.buffer.max_read_position()
    out = set()
    for entry in topic.ledger.read_entries(Position.EARLIEST, 10**6, horizon):
        if not entry.is_marker and not topic.buffer.hides(entry):
            out.update(m.data for m in decode_entry(topic.name, entry.position, bytes(entry.data)))
    return out


@pytest.mark.parametrize("kill_point,seed", [("materialise-buffer", 1), ("materialise-acks", 2),
                                             ("after-cas", 3)])
async def test_kill_9_then_restart_finishes_everything(tmp_path, kill_point, seed):
    data_dir = tmp_path / "data"
    lines = await asyncio.to_thread(run_child, data_dir, seed, kill_point)
    sent: dict[int, list[int]] = {}
    acked: dict[int, list[int]] = {}
    plain: list[int] = []
    ending: dict[int, TxnAction] = {}
    for line in lines:
        kind, *fields = line.split()
        if kind == "SENT":
            sent.setdefault(int(fields[0]), []).append(int(fields[1]))
        elif kind == "ACKED":
            acked.setdefault(int(fields[0]), []).append(int(fields[1]))
        elif kind == "PLAIN":
            plain.append(int(fields[0]))
        elif kind == "ENDING":
            ending[int(fields[0])] = TxnAction[fields[1]]
    assert ending, lines

    async with Broker.embedded(data_dir, sync=False, txn_v5_retention_ms=0) as broker:
        service = broker.service
        v5 = service.v5
        topic = await service.get_topic(SEGMENT)
        subscription = topic.subscriptions[SUB]
        txns = {least: TxnId(V5_COORDINATOR_ID, least) for least in sent}
        states = {}
        for least, txn in txns.items():
            found = await v5.coordinator.get_header(txn)
            states[least] = found[0].state
        if kill_point == "after-cas":
            # the last END_TXN was decided but never answered: the client's retry gets the answer
            last = max(ending)
            decided = HeaderState.COMMITTED if ending[last] is TxnAction.COMMIT else HeaderState.ABORTED
            assert states[last] is decided
            assert await service.coordinator.end_transaction(txns[last], ending[last]) is decided.status
            other = TxnAction.ABORT if ending[last] is TxnAction.COMMIT else TxnAction.COMMIT
            with pytest.raises(InvalidTxnStatusError):
                await service.coordinator.end_transaction(txns[last], other)
        # a txn the child never got to end is still OPEN: abort it now
        for least, state in states.items():
            if state is HeaderState.OPEN:
                assert least not in ending or kill_point != "after-cas" or least != max(ending)
                assert await service.coordinator.end_transaction(txns[least], TxnAction.ABORT) is TxnStatus.ABORTED
                states[least] = HeaderState.ABORTED
        # every decision taken before the kill was final for the store; requested ones match
        for least, action in ending.items():
            if states[least] is not HeaderState.OPEN and least in txns:
                assert states[least] in (HeaderState.COMMITTED, HeaderState.ABORTED)

        async def settled() -> bool:
            return not await v5.store.list_prefix("/txn-op/") and not topic.buffer._materialising \
                and not subscription.pending_ack._deciding

        for _ in range(500):
            if await settled():
                break
            await asyncio.sleep(0.01)
        assert await settled(), await v5.store.list_prefix("/txn-op/")

        committed = {label for least, labels in sent.items() if states[least] is HeaderState.COMMITTED
                     for label in labels}
        aborted = {label for least, labels in sent.items() if states[least] is HeaderState.ABORTED
                   for label in labels}
        seen = visible_labels(topic)
        assert {b"t%d" % label for label in committed} <= seen
        assert not {b"t%d" % label for label in aborted} & seen
        assert {b"p%d" % label for label in plain} <= seen
        plain_ids = sorted(e.position for e in topic.ledger.read_entries(Position.EARLIEST, len(plain)))
        for least, labels in acked.items():
            for label in labels:
                is_acked = subscription.cursor.is_acked(plain_ids[label])
                if states[least] is HeaderState.COMMITTED:
                    assert is_acked, (least, label)
        committed_acks = {plain_ids[label] for least, labels in acked.items()
                          if states[least] is HeaderState.COMMITTED for label in labels}
        for position in plain_ids:
            if position not in committed_acks:
                assert not subscription.cursor.is_acked(position)
        # GC: zero op records, zero headers of finished txns
        await v5.coordinator.collect_garbage()
        assert len(await v5.store.list_prefix("/txn-op/")) == 0
        assert len(await v5.store.list_prefix("/txn/")) == 0


@pytest.mark.parametrize("seed", [1, 2])
async def test_no_transactional_entry_without_its_op_record_after_kill_9(tmp_path, seed):
    """LMDB: a send's entry and its op record are one write transaction, so a kill -9 at any
    moment never leaves an entry that no op record ties to its (open) txn."""
    import random

    data_dir = tmp_path / "data"
    child = subprocess.Popen([sys.executable, "-m", "tests.transaction.v5.crash_child", str(data_dir), "0",
                              "appends"], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "READY"
        assert (await asyncio.to_thread(child.stdout.readline)).startswith("SENT")    # it is sending
        await asyncio.sleep(0.1 + random.Random(seed).random() * 0.5)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        child.stdout.close()
    async with Broker.embedded(data_dir, sync=False) as broker:
        topic = await broker.service.get_topic(SEGMENT)
        entries = [e for e in topic.ledger.read_entries(Position.EARLIEST, 10**7) if e.txn_most >= 0]
        assert entries, "the child wrote nothing before the kill"
        from pyengine.transaction.coordinator.metadata_records import IDX_WRITES

        recorded = {(r.partition_key, tuple(json_position(r.value)))
                    for r in await broker.service.metadata.range_query(IDX_WRITES, prefix=(SEGMENT,))}
        orphans = [e.position for e in entries
                   if (f"{e.txn_most}-{e.txn_least}", (e.position.ledger_id, e.position.entry_id)) not in recorded]
        assert orphans == [], f"{len(orphans)} of {len(entries)} entries have no op record"
        # and the open txns still hold the horizon back at their first entry
        assert topic.buffer.max_read_position() < entries[0].position


def json_position(value: bytes) -> list[int]:
    import json

    return json.loads(value)["position"]

