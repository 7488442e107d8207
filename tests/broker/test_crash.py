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


# --- consume-transform-produce across a kill -9 -----------------------------------------------

SOURCE, SINK = "persistent://public/default/ctp-in", "persistent://public/default/ctp-out"
INPUTS = 300
PER_STEP = 5

TRANSFORMER = textwrap.dedent("""
    import asyncio, sys
    from pyengine.broker import Broker

    async def transform(broker, consumer, producer, report):
        while True:
            batch = [await consumer.receive()]
            while len(batch) < %(per_step)d:
                try:
                    batch.append(await consumer.receive(timeout=0.05))
                except TimeoutError:
                    break
            txn = await broker.new_transaction(timeout_ms=2000)
            await asyncio.gather(*(producer.send(b"out-" + m.data, txn=txn) for m in batch),
                                 *(consumer.acknowledge(m, txn=txn) for m in batch))
            await txn.commit()
            report(batch)

    async def main(path):
        async with Broker.embedded(path) as broker:
            consumer = await broker.subscribe("%(source)s", "ctp", initial_position="earliest")
            producer = await broker.create_producer("%(sink)s")
            await transform(broker, consumer, producer,
                            lambda batch: print("C", *(m.data.decode() for m in batch), flush=True))

    if __name__ == "__main__":
        asyncio.run(main(sys.argv[1]))
""") % {"per_step": PER_STEP, "source": SOURCE, "sink": SINK}


@pytest.mark.parametrize("seed", [1, 2])
async def test_consume_transform_produce_is_exactly_once_across_kill_9(tmp_path, seed):
    """Transactions that each take messages off one topic (acknowledged in the transaction) and
    put their transforms on another, killed at a random point (also in the middle of an
    end-txn), then finished by a restarted broker: every input comes out exactly once, and
    every step the worker saw committed is there. Participants are real topics and
    subscriptions (pending acks, transaction buffers), not test doubles."""
    data = tmp_path / "data"
    async with Broker.embedded(data) as broker:
        producer = await broker.create_producer(SOURCE)
        for i in range(INPUTS):
            await producer.send(b"in-%d" % i)
    proc = subprocess.Popen([sys.executable, "-c", TRANSFORMER, str(data)], stdout=subprocess.PIPE, text=True,
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    kill_after = random.Random(seed).randrange(5, 40)
    head: list[str] = []
    deadline = time.monotonic() + 120
    while len(head) < kill_after and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        head.append(line)
    proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate()
    committed = [item for line in ("".join(head) + out).splitlines() if line.startswith("C ")
                 for item in line.split()[1:]]
    assert len(committed) >= PER_STEP, "the worker committed nothing before the kill"

    namespace: dict = {}
    exec(compile(TRANSFORMER, "transformer", "exec"), namespace)     # the same loop, in this process
    async with Broker.embedded(data) as broker:
        consumer = await broker.subscribe(SOURCE, "ctp", initial_position="earliest")
        producer = await broker.create_producer(SINK)
        finishing = asyncio.ensure_future(namespace["transform"](broker, consumer, producer, lambda batch: None))
        check = await broker.subscribe(SINK, "check", initial_position="earliest")
        outputs, quiet_since = [], time.monotonic()
        # Transactions left open by the kill time out (2 s) and release their acks: wait for them.
        while len(outputs) < INPUTS or time.monotonic() - quiet_since < 1:
            try:
                outputs.append((await check.receive(timeout=0.5)).data.decode())
                quiet_since = time.monotonic()
            except TimeoutError:
                if time.monotonic() - quiet_since > 30:
                    break
        finishing.cancel()
        await asyncio.gather(finishing, return_exceptions=True)
    counts = Counter(outputs)
    assert [item for item, n in counts.items() if n > 1] == [], "an input was transformed twice"
    assert set(counts) == {f"out-in-{i}" for i in range(INPUTS)}, "an input was lost"
    assert {f"out-{item}" for item in committed} <= set(counts)
