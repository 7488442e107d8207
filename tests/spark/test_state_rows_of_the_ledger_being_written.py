"""A state captured while the broker runs knows the ledger it is writing to, even empty.

A broker writes to a new ledger after each start (and each roll-over); until its first entry
that ledger is empty. The capture recorded only the ledgers holding entries, yet its ledger
counter already covered the empty one, so the rows written to it after the capture (an export
of every stored row, filtered later with `committed_filter`/`committed_rows`) were taken for
rows of a topic the capture did not know: a ValueError "capture the state of every topic the
DataFrame holds" instead of "not visible yet" (they are past the captured read horizon).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from pyengine.broker import Broker
from spark_udfs.schema import VISIBILITY_COLUMNS
from spark_udfs.state import TxnState
from tests.spark.workload import read_directly

TOPIC = "persistent://public/default/orders"
# LMDB allows one environment per process: the capture runs beside the broker, as it would.
_CAPTURE = ("import sys; from spark_udfs.state import capture_state; "
            "sys.stdout.buffer.write(capture_state(sys.argv[1]).to_bytes())")


async def _write_around_a_capture(data_dir: Path) -> bytes:
    async with Broker.embedded(data_dir) as broker:
        producer = await broker.create_producer(TOPIC)
        await producer.send(b"first run")
    async with Broker.embedded(data_dir) as broker:
        producer = await broker.create_producer(TOPIC)          # a new ledger, empty
        captured = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", _CAPTURE, str(data_dir)],
                                           capture_output=True, check=True, cwd=Path(__file__).resolve().parents[2])
        txn = await broker.new_transaction()
        await producer.send(b"after the capture", txn=txn)
        await txn.commit()
        await producer.send(b"plain, after the capture")
    return captured.stdout


def test_rows_written_after_the_capture_to_its_empty_ledger_are_not_visible_yet(tmp_path):
    data_dir = tmp_path / "data"
    state = TxnState.from_bytes(asyncio.run(_write_around_a_capture(data_dir)))
    raw = read_directly(data_dir, isolation="read_uncommitted", includeMarkers="true")
    ledgers = raw.column("ledger_id").to_pylist()
    assert len(set(ledgers)) == 2 and max(ledgers) <= state.max_ledger_id    # the second ledger existed
    columns = [raw.column(name).combine_chunks() for name in VISIBILITY_COLUMNS]
    visible = state.prepared().mask(*columns).to_pylist()
    assert [value for value, shown in zip(raw.column("value").to_pylist(), visible) if shown] == [b"first run"]
    _, counts = state.prepared().classify(*columns)
    assert counts == {"visible": 1, "marker": 1, "aborted": 0, "uncommitted": 2}
