"""kill -9 of an embedded broker in the middle of transactions, at random points: after a
restart nothing acknowledged is lost, nothing aborted becomes visible, and every transaction
is atomic (all of its messages or none), including the ones caught mid end-txn."""

import asyncio
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest

from pyengine.broker import Broker

ROOT = Path(__file__).resolve().parents[2]
TOPIC = "persistent://public/default/crash"
PER_TXN = 5

WORKER = textwrap.dedent("""
    import asyncio, sys
    from pyengine.broker import Broker

    async def one(broker, producer, i):
        txn = await broker.new_transaction(timeout_ms=2000)
        await asyncio.gather(*(producer.send(f"{i}-{k}".encode(), txn=txn) for k in range(%(per_txn)d)))
        if i %% 3 == 0:
            await txn.abort()
            print(f"A {i}", flush=True)
        else:
            await txn.commit()
            print(f"C {i}", flush=True)

    async def main(path):
        async with Broker.embedded(path) as broker:
            producer = await broker.create_producer("%(topic)s")
            plain = 0
            i = 0
            while True:
                await asyncio.gather(*(one(broker, producer, i + k) for k in range(4)))
                await producer.send(f"plain-{plain}".encode())
                print(f"P {plain}", flush=True)
                plain += 1
                i += 4

    asyncio.run(main(sys.argv[1]))
""") % {"per_txn": PER_TXN, "topic": TOPIC}


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_transactions_survive_kill_9_atomically(tmp_path, seed):
    data = tmp_path / "data"
    proc = subprocess.Popen([sys.executable, "-c", WORKER, str(data)], stdout=subprocess.PIPE, text=True,
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    # Kill at a random point once the worker has done some of everything (by its own output,
    # not by the clock: on a loaded machine start-up alone can take seconds).
    kill_after = random.Random(seed).randrange(12, 60)
    head: list[str] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        head.append(line)
        kinds = {entry.split()[0] for entry in head}
        if len(head) >= kill_after and {"C", "A", "P"} <= kinds:
            break
    proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate()
    lines = [line.split() for line in ("".join(head) + out).splitlines() if line.strip()]
    committed = {int(n) for kind, n in lines if kind == "C"}
    aborted = {int(n) for kind, n in lines if kind == "A"}
    plain = {int(n) for kind, n in lines if kind == "P"}
    assert committed and aborted, "the worker did too little before the kill to test anything"

    async with Broker.embedded(data) as broker:
        # Transactions left open by the crash time out (2 s) and are aborted; ones caught after
        # their decision are finished by recovery.
        await asyncio.sleep(2.5)
        await broker.service.coordinator.wait_for_endings()
        consumer = await broker.subscribe(TOPIC, "check", initial_position="earliest")
        seen = []
        while True:
            try:
                seen.append((await consumer.receive(timeout=0.5)).data.decode())
            except TimeoutError:
                break
    counts = Counter(seen)
    assert all(c == 1 for c in counts.values()), "a message was stored twice"
    by_txn = Counter(int(m.split("-")[0]) for m in seen if not m.startswith("plain"))
    for txn in committed:
        assert by_txn[txn] == PER_TXN, f"committed txn {txn} lost messages"
    for txn in aborted:
        assert by_txn[txn] == 0, f"aborted txn {txn} became visible"
    assert all(n == PER_TXN for n in by_txn.values()), "a transaction became visible in part"
    assert all(txn % 3 != 0 for txn in by_txn), "an aborted transaction became visible"
    seen_plain = {int(m.split("-")[1]) for m in seen if m.startswith("plain")}
    assert plain <= seen_plain, "an acknowledged plain message was lost"
