"""Crash test: a process appending, committing and aborting txns (and plain entries) is killed
with SIGKILL, twice; after recovery nothing acknowledged is lost and nothing aborted is visible."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import defaultdict
from pathlib import Path

import pytest

from pyengine.storage import ManagedLedger, ManagedLedgerConfig, StorageEnvironment
from pyengine.transaction.buffer.config import TopicTransactionBufferConfig
from pyengine.transaction.buffer.topic_buffer import TopicTransactionBuffer
from pyengine_kernels import Position, TxnId
from tests.transaction.buffer.helpers import visible_positions

ROOT = Path(__file__).resolve().parents[3]
TOPIC = "persistent://public/default/crash"
LEDGER_CONFIG = ManagedLedgerConfig(max_entries_per_ledger=40)
BUFFER_CONFIG = TopicTransactionBufferConfig(snapshot_max_txn_count=7, snapshot_min_interval_ms=30)

# Prints a line for every step once it is acknowledged: S(tarted) seq, A(ppended) seq ledger
# entry, E(nd requested) seq action, D(one) seq action, P(lain) ledger entry.
WRITER = textwrap.dedent(f"""
    import asyncio, random, sys
    from pyengine.storage import ManagedLedger, ManagedLedgerConfig, StorageEnvironment
    from pyengine.transaction.buffer.config import TopicTransactionBufferConfig
    from pyengine.transaction.buffer.topic_buffer import TopicTransactionBuffer
    from pyengine_kernels import TxnId

    def say(*words):
        print(*words, flush=True)

    async def main(path, base, seed):
        env = StorageEnvironment(path)
        ledger = await ManagedLedger.open(env, {TOPIC!r}, {LEDGER_CONFIG!r})
        buffer = TopicTransactionBuffer(ledger, {BUFFER_CONFIG!r})
        await buffer.recover()
        rng = random.Random(seed)

        async def txn(seq):
            say("S", seq)
            t = TxnId(1, seq)
            appends = [buffer.append(t, f"{{seq}}-{{k}}".encode()) for k in range(rng.randint(1, 3))]
            for position in await asyncio.gather(*appends):
                say("A", seq, position.ledger_id, position.entry_id)
            roll = rng.random()
            if roll < 0.1:
                return                                 # left open: its coordinator will time it out
            action = "commit" if roll < 0.6 else "abort"
            say("E", seq, action)
            await getattr(buffer, action)(t, -1)
            say("D", seq, action)

        async def plain():
            position = await ledger.append(b"plain")
            say("P", position.ledger_id, position.entry_id)

        seq = base
        while True:
            await asyncio.gather(*(txn(seq + i) for i in range(4)), plain())
            seq += 4

    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
""")


def run_and_kill(data: Path, base: int, delay: float) -> list[list[str]]:
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(data), str(base), str(base + 7)],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    time.sleep(delay + 1.5)              # interpreter start-up, then writes in full flow
    proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    complete = out.split("\n")[:-1]     # the kill may cut the last line short
    return [line.split() for line in complete if line.strip()]


@pytest.mark.parametrize("delay", [0.2, 0.7])
async def test_nothing_acknowledged_is_lost_and_nothing_aborted_shows_after_kill_9(tmp_path, delay):
    data = tmp_path / "crash"
    log = run_and_kill(data, 0, delay) + run_and_kill(data, 1_000_000, delay / 2)
    started = {int(w[1]) for w in log if w[0] == "S"}
    appended: dict[int, list[Position]] = defaultdict(list)
    for w in log:
        if w[0] == "A":
            appended[int(w[1])].append(Position(int(w[2]), int(w[3])))
    requested = {int(w[1]): w[2] for w in log if w[0] == "E"}
    done = {int(w[1]): w[2] for w in log if w[0] == "D"}
    plain = [Position(int(w[1]), int(w[2])) for w in log if w[0] == "P"]
    assert len(done) > 20 and plain, "the writer acknowledged too little to make the test meaningful"

    env = StorageEnvironment(data)
    try:
        ledger = await ManagedLedger.open(env, TOPIC, LEDGER_CONFIG)
        buffer = TopicTransactionBuffer(ledger, BUFFER_CONFIG)
        await buffer.recover()
        # Right after recovery nothing of a txn not committed may show (open ones hold the horizon).
        for entry in ledger.read_entries(Position.EARLIEST, 10**7, buffer.max_read_position()):
            if entry.txn is not None and not entry.is_marker and not buffer.is_txn_aborted(entry.txn):
                assert requested.get(entry.txn.least_bits) == "commit", f"{entry.position} shows too early"
        # The coordinator finishes what it decided (the end requests in flight at the kill) and
        # times out every other txn it started.
        decided = {seq: requested.get(seq, "abort") for seq in started}
        for seq, action in sorted(decided.items()):
            await getattr(buffer, action)(TxnId(1, seq), -1)
        assert buffer.ongoing_txns() == []
        assert buffer.max_read_position() == ledger.lac
        visible = visible_positions(ledger, buffer)
        for seq, positions in appended.items():
            for position in positions:
                assert ledger.read_entry(position) is not None, f"acknowledged entry {position} is lost"
                assert (position in visible) == (decided[seq] == "commit"), (seq, decided[seq], position)
        assert set(plain) <= visible
        for entry in ledger.read_entries(Position.EARLIEST, 10**7):
            if entry.position in visible and entry.txn is not None:
                assert decided[entry.txn.least_bits] == "commit", f"{entry.position} of an aborted txn is visible"
        for seq, action in done.items():
            assert buffer.is_txn_aborted(TxnId(1, seq)) == (action == "abort")
        await buffer.close()
        await ledger.close()
        await env.drain()
    finally:
        env.close()
