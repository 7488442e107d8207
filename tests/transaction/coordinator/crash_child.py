"""The process the crash tests kill with SIGKILL: a coordinator service under random load.

    python -m tests.transaction.coordinator.crash_child DATA_DIR JOURNAL SEED [--hang-on TOPIC]

It appends what it learnt to JOURNAL (unbuffered, one line per event, so a kill loses at most
the line being written):
    N most least          new_transaction answered
    A most least target   add_* answered (target: a topic, or topic/subscription)
    E most least ACTION   end_transaction called
    D most least STATUS   end_transaction answered
    P most least ACTION target   a participant confirmed a call
With --hang-on, calls to that topic never return (the txn stays COMMITTING/ABORTING); it
prints "deciding ACTION most least" when such a call arrives, i.e. once that decision is durable.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import sys

from pyengine.storage import StorageEnvironment
from pyengine.transaction import TxnAction
from pyengine.transaction.coordinator.retry import Backoff
from pyengine.transaction.coordinator.service import TransactionCoordinatorService
from pyengine_kernels import TxnId

NUM_COORDINATORS = 4
TOPICS = ["t0", "t1", "t2", "t3"]
SUBSCRIPTIONS = [("t0", "s"), ("t1", "s"), ("t2", "s2")]


class Journal:
    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, *fields: object) -> None:
        os.write(self._fd, (" ".join(map(str, fields)) + "\n").encode())


def target_name(target: str | tuple[str, str]) -> str:
    return target if isinstance(target, str) else "/".join(target)


class JournalingParticipants:
    def __init__(self, journal: Journal, rng: random.Random, hang_on: str | None) -> None:
        self.journal = journal
        self.rng = rng
        self.hang_on = hang_on

    async def end_txn_on_partition(self, topic: str, txn: TxnId, action: TxnAction, low_watermark: int, *,
                                   after: asyncio.Future | None = None) -> None:
        if after is not None:           # a journal outside the coordinator's storage: decision first
            await asyncio.shield(after)
        await self._handle(topic, txn, action)

    async def end_txn_on_subscription(self, topic: str, subscription: str, txn: TxnId, action: TxnAction,
                                      low_watermark: int) -> None:
        await self._handle((topic, subscription), txn, action)

    async def _handle(self, target: str | tuple[str, str], txn: TxnId, action: TxnAction) -> None:
        if target == self.hang_on:
            print("deciding", action.name, txn.most_bits, txn.least_bits, flush=True)
            await asyncio.Event().wait()
        await asyncio.sleep(self.rng.random() * 0.004)
        if self.rng.random() < 0.2:
            raise ConnectionError("transient")
        self.journal.write("P", txn.most_bits, txn.least_bits, action.name, target_name(target))


async def one_transaction(service: TransactionCoordinatorService, journal: Journal, rng: random.Random) -> None:
    timeout_ms = rng.choice([60_000, 60_000, 60_000, rng.randint(20, 300)])
    txn = await service.new_transaction(rng.randrange(NUM_COORDINATORS), timeout_ms)
    journal.write("N", txn.most_bits, txn.least_bits)
    try:
        for topic in rng.sample(TOPICS, rng.randint(0, 3)):
            await service.add_produced_partitions(txn, [topic])
            journal.write("A", txn.most_bits, txn.least_bits, topic)
        for sub in rng.sample(SUBSCRIPTIONS, rng.randint(0, 2)):
            await service.add_acked_subscriptions(txn, [sub])
            journal.write("A", txn.most_bits, txn.least_bits, target_name(sub))
        await asyncio.sleep(rng.random() * 0.02)
        if rng.random() < 0.15:
            return                                   # abandoned: only the timeout ends it
        action = rng.choice([TxnAction.COMMIT, TxnAction.ABORT])
        journal.write("E", txn.most_bits, txn.least_bits, action.name)
        status = await service.end_transaction(txn, action)
        journal.write("D", txn.most_bits, txn.least_bits, status.name)
    except Exception as exc:        # e.g. a commit after the timeout aborted it
        journal.write("X", txn.most_bits, txn.least_bits, type(exc).__name__)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data_dir")
    parser.add_argument("journal")
    parser.add_argument("seed", type=int)
    parser.add_argument("--hang-on")
    args = parser.parse_args()
    logging.getLogger("pyengine").setLevel(logging.ERROR)     # retries of the flaky participants
    rng = random.Random(args.seed)
    journal = Journal(args.journal)
    env = StorageEnvironment(args.data_dir)
    service = TransactionCoordinatorService(
        env, JournalingParticipants(journal, rng, args.hang_on), num_coordinators=NUM_COORDINATORS,
        backoff=Backoff(initial_ms=1, max_ms=20))
    await service.start()
    print("ready", flush=True)
    running: set[asyncio.Task[None]] = set()
    while True:                      # until killed
        while len(running) < 20:
            task = asyncio.create_task(one_transaction(service, journal, rng))
            running.add(task)
            task.add_done_callback(running.discard)
        await asyncio.sleep(0.001)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
