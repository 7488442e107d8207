"""kill -9 of a coordinator right after a transaction key's new epoch (or its deletion) became
durable and before the fenced transaction's abort did: the restarted coordinator must abort
that transaction itself. Nobody else will: the fenced task's requests are all refused
(ExpiredTransactionError), a deleted key cannot be deleted again (404), and waiting for the
timeout holds the read horizon of every topic the txn wrote to for up to its whole timeout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pyengine.transaction import TxnAction, TxnStatus
from pyengine.transaction.coordinator.clock import wall_clock_ms
from pyengine.transaction.coordinator.keys import ANONYMOUS, KeyNotFoundError, coordinator_for
from pyengine_kernels import TxnId
from tests.transaction.coordinator.fakes import FakeClock, RecordingParticipants
from tests.transaction.coordinator.helpers import ServiceHarness

ROOT = Path(__file__).resolve().parents[3]
N = 4
KEY = "job"

CHILD = textwrap.dedent("""
    import asyncio, sys
    from pyengine.storage import StorageEnvironment
    from pyengine.transaction.coordinator.keys import ANONYMOUS, coordinator_for
    from pyengine.transaction.coordinator.service import TransactionCoordinatorService
    from tests.transaction.coordinator.fakes import RecordingParticipants

    async def main(path, how):
        service = TransactionCoordinatorService(StorageEnvironment(path), RecordingParticipants(),
                                                num_coordinators=%(n)d)
        await service.start()
        tc = coordinator_for(ANONYMOUS, "%(key)s", %(n)d)
        await service.keys.connect(ANONYMOUS, "%(key)s", tc, -1)
        txn = await service.keys.new_transaction(ANONYMOUS, "%(key)s", 0, tc, 600_000)
        await service.add_produced_partitions(txn, ["out"])
        await service.add_acked_subscriptions(txn, [("in", "sub")])
        print("txn", txn.most_bits, txn.least_bits, flush=True)

        async def crash_point(txn):          # the fence is durable; the abort is not written yet
            print("fencing", flush=True)
            await asyncio.Event().wait()

        service.abort_fenced = crash_point
        if how == "connect":
            await service.keys.connect(ANONYMOUS, "%(key)s", tc, -1)
        else:
            await service.keys.delete(ANONYMOUS, "%(key)s")

    asyncio.run(main(sys.argv[1], sys.argv[2]))
""") % {"n": N, "key": KEY}


def run_child_until_fenced(data: Path, how: str) -> TxnId:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(data), how], stdout=subprocess.PIPE, text=True,
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        txn = None
        for line in proc.stdout:
            if line.startswith("txn "):
                _, most, least = line.split()
                txn = TxnId(int(most), int(least))
            elif line.startswith("fencing"):
                break
        else:
            pytest.fail(f"the child exited with {proc.wait(30)} before fencing")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        proc.stdout.close()
    assert txn is not None
    return txn


@pytest.mark.parametrize("how", ["connect", "delete"])
async def test_a_txn_fenced_just_before_a_kill_9_is_aborted_by_the_restart(tmp_path, how):
    txn = run_child_until_fenced(tmp_path / "data", how)
    participants = RecordingParticipants()
    # Restarted at once: the txn's 10-minute timeout is far away.
    harness = ServiceHarness(tmp_path / "data", participants, FakeClock(wall_clock_ms()), num_coordinators=N)
    service = await harness.start()
    try:
        await service.wait_for_endings()
        assert service.get(txn).status == TxnStatus.ABORTED
        assert participants.told(txn) == {"out": {TxnAction.ABORT}, ("in", "sub"): {TxnAction.ABORT}}
        if how == "delete":
            with pytest.raises(KeyNotFoundError):             # the admin cannot repeat it
                await service.keys.delete(ANONYMOUS, KEY)
        # The fence itself survived: the epoch never goes back below it.
        assert await service.keys.connect(ANONYMOUS, KEY, coordinator_for(ANONYMOUS, KEY, N), -1) == 2
    finally:
        await harness.stop()
