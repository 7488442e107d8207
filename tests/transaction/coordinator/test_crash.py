"""Crash tests: a coordinator under random load killed with SIGKILL at random moments, then
restarted on the same data dir (the checks are in `crash.restart_and_check`)."""

from __future__ import annotations

import random
import time

import pytest

from pyengine.transaction import TxnAction, TxnStatus
from pyengine_kernels import TxnId
from tests.transaction.coordinator.crash import Child, JournalView, restart_and_check


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
async def test_sigkill_at_a_random_moment_under_load(tmp_path, seed):
    rng = random.Random(seed)
    journal = tmp_path / "journal"
    child = Child(tmp_path / "data", journal, seed)
    child.wait_for("ready")
    # More than 20 txns created first (the check below), then a random moment: a fixed time
    # alone was too short on a loaded machine. (Killed in any case: that check tells.)
    deadline = time.monotonic() + 60
    while (not journal.exists() or len(JournalView.read(journal).created) <= 20) \
            and child.process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(rng.uniform(0.05, 0.8))
    child.kill()
    view, final = await restart_and_check(tmp_path / "data", journal)
    assert len(view.created) > 20, "the child did too little before it was killed to test anything"
    assert set(final.values()) & {TxnStatus.COMMITTED, TxnStatus.ABORTED}


@pytest.mark.slow
async def test_sigkill_between_committing_and_committed_pulsar_20150(tmp_path):
    """Pulsar #20150: a committed txn reverted to OPEN after a broker restart. Here the broker
    dies (SIGKILL) after COMMITTING is durable and before COMMITTED is written: the restart
    must finish the commit, never reopen the txn."""
    journal = tmp_path / "journal"
    child = Child(tmp_path / "data", journal, seed=1, hang_on="t0")
    child.wait_for("ready")
    _, action, most, least = child.wait_for("deciding COMMIT").split()
    child.kill()
    txn = TxnId(int(most), int(least))
    view, final = await restart_and_check(tmp_path / "data", journal)
    assert view.requested[txn] == TxnAction.COMMIT and txn not in view.answered
    assert final[txn] == TxnStatus.COMMITTED
