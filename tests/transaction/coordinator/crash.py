"""Running `crash_child` in a subprocess, killing it with SIGKILL, and checking what a restarted
coordinator makes of the data dir it left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from pyengine.transaction import TxnAction, TxnStatus
from pyengine.transaction.coordinator.clock import wall_clock_ms
from pyengine_kernels import TxnId
from tests.transaction.coordinator.crash_child import NUM_COORDINATORS, target_name
from tests.transaction.coordinator.fakes import FakeClock, RecordingParticipants
from tests.transaction.coordinator.helpers import ServiceHarness

ROOT = Path(__file__).resolve().parents[3]
DAY_MS = 24 * 3600 * 1000


class Child:
    def __init__(self, data_dir: Path, journal: Path, seed: int, hang_on: str | None = None) -> None:
        command = [sys.executable, "-m", "tests.transaction.coordinator.crash_child", str(data_dir), str(journal),
                   str(seed)]
        if hang_on:
            command += ["--hang-on", hang_on]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)

    def wait_for(self, prefix: str, timeout_s: float = 60) -> str:
        """The first stdout line starting with `prefix` (fails if the child dies first)."""
        assert self.process.stdout is not None
        while True:
            line = self.process.stdout.readline()
            assert line, f"the child exited with {self.process.wait(timeout_s)} before printing {prefix!r}"
            if line.startswith(prefix):
                return line.strip()

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)
        assert self.process.stdout is not None
        self.process.stdout.close()


@dataclass
class JournalView:
    created: set[TxnId] = field(default_factory=set)
    added: dict[TxnId, set[str]] = field(default_factory=lambda: defaultdict(set))
    requested: dict[TxnId, TxnAction] = field(default_factory=dict)
    answered: dict[TxnId, TxnStatus] = field(default_factory=dict)
    told: dict[TxnId, set[tuple[TxnAction, str]]] = field(default_factory=lambda: defaultdict(set))

    @classmethod
    def read(cls, path: Path) -> JournalView:
        view = cls()
        complete_lines = path.read_text().split("\n")[:-1]     # a kill may cut the last line short
        for line in complete_lines:
            fields = line.split()
            kind, txn = fields[0], TxnId(int(fields[1]), int(fields[2]))
            if kind == "N":
                view.created.add(txn)
            elif kind == "A" and len(fields) == 4:
                view.added[txn].add(fields[3])
            elif kind == "E" and len(fields) == 4:
                view.requested[txn] = TxnAction[fields[3]]
            elif kind == "D" and len(fields) == 4:
                view.answered[txn] = TxnStatus[fields[3]]
            elif kind == "P" and len(fields) == 5:
                view.told[txn].add((TxnAction[fields[3]], fields[4]))
        return view


async def restart_and_check(data_dir: Path, journal: Path) -> tuple[JournalView, dict[TxnId, TxnStatus]]:
    """Restart on the dead child's data dir a day later (every OPEN txn has timed out) and check:
    every txn ends; an answered END_TXN keeps its answer (a COMMITTED txn stays COMMITTED); an
    unanswered one ends with the decision asked for, or TIME_OUT if that decision never became
    durable; a txn never ended by the client ends TIME_OUT; participants heard the outcome and
    never the other action; txn ids are not reused. Returns the journal and the final statuses."""
    view = JournalView.read(journal)
    participants = RecordingParticipants()
    harness = ServiceHarness(data_dir, participants, FakeClock(wall_clock_ms() + DAY_MS),
                             num_coordinators=NUM_COORDINATORS, finished_retention_ms=10 * DAY_MS)
    service = await harness.start()
    await service.wait_for_endings()
    final = {txn: service.get(txn).status for txn in view.created}
    for txn, status in final.items():
        assert status.is_terminal, (txn, status)
        if txn in view.answered:
            assert status == view.answered[txn], (txn, status, view.answered[txn])
        elif txn in view.requested:
            wanted = TxnStatus.COMMITTED if view.requested[txn] == TxnAction.COMMIT else TxnStatus.ABORTED
            assert status in (wanted, TxnStatus.TIME_OUT), (txn, status, view.requested[txn])
        else:
            assert status == TxnStatus.TIME_OUT, (txn, status)
        told = view.told[txn] | {(c.action, target_name(c.target)) for c in participants.calls_for(txn) if c.confirmed}
        assert {action for action, _ in told} <= {status.outcome}, (txn, status, told)
        assert view.added[txn] <= {target for _, target in told}, (txn, view.added[txn], told)
    for cid in range(NUM_COORDINATORS):
        fresh = await service.new_transaction(cid, 1000)
        assert all(fresh.least_bits > txn.least_bits for txn in view.created if txn.most_bits == cid)
    await harness.stop()
    return view, final
