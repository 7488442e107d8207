"""A broker process for the v5 crash tests: it runs v5 transactions on a segment:// topic of
its data dir (LMDB: data and metadata store) and SIGKILLs itself at a chosen point.

    python -m tests.transaction.v5.crash_child DATA_DIR SEED KILL_POINT

Kill points:
  materialise-buffer    the buffer saved the aborted set (or evicted a commit) but has not
                        deleted its op records yet
  materialise-acks      the pending acks were applied to the cursor, their op records not deleted
  after-cas             the coordinator's header CAS landed, the client was not answered
  appends               none: transactional sends in a loop (three open txns) until the parent
                        kills the process at a random moment

Prints, flushed, one line per fact the parent relies on: `SENT <least> <label>` once a
transactional send is durable, `ACKED <least> <label>` once a transactional ack is, `PLAIN
<label>` for a plain message, `ENDING <least> COMMIT|ABORT` before END_TXN. The kill is
`os.kill(getpid(), SIGKILL)`: no cleanup runs.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys

from pyengine.broker import Broker
from pyengine.transaction import TxnAction
from pyengine.transaction.buffer.metadata_buffer import MetadataTransactionBuffer
from pyengine.transaction.coordinator.metadata_coordinator import MetadataTransactionCoordinator
from pyengine.transaction.pendingack.metadata_store import MetadataPendingAckStore

SEGMENT = "segment://public/default/crash/0000-ffff-0"
SUB = "sub"


def say(line: str) -> None:
    print(line, flush=True)


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def arm(kill_point: str, after: int) -> None:
    """Replace the step right after the chosen point by a SIGKILL, on its `after`-th call."""
    calls = {"n": 0}

    def due() -> bool:
        calls["n"] += 1
        return calls["n"] >= after

    if kill_point == "materialise-buffer":
        original = MetadataTransactionBuffer._delete_ops

        async def delete_ops(self, txn):
            if due():
                die()
            await original(self, txn)

        MetadataTransactionBuffer._delete_ops = delete_ops
    elif kill_point == "materialise-acks":
        original_delete = MetadataPendingAckStore.delete_records

        def delete_records(self, seqs):
            if due():
                die()
            return original_delete(self, seqs)

        MetadataPendingAckStore.delete_records = delete_records
    elif kill_point == "after-cas":
        original_put = None

        original_decide = MetadataTransactionCoordinator._decide

        async def decide(self, txn, action, *, timed_out):
            store = self.store
            nonlocal original_put
            original_put = store.put

            async def put(path, value, expected_version=None, **kw):
                record = await original_put(path, value, expected_version, **kw)
                if path.startswith("/txn/") and due():
                    die()                       # the CAS landed; nobody is answered
                return record

            store.put = put
            try:
                return await original_decide(self, txn, action, timed_out=timed_out)
            finally:
                store.put = original_put

        MetadataTransactionCoordinator._decide = decide
    else:
        raise SystemExit(f"unknown kill point {kill_point!r}")


async def appends(data_dir: str) -> None:
    async with Broker.embedded(data_dir, sync=True) as broker:
        producer = await broker.create_producer(SEGMENT)
        txns = [await broker.new_transaction(timeout_ms=600_000, version=5) for _ in range(3)]
        say("READY")
        label = 0
        while True:
            await asyncio.gather(*(producer.send(b"t%d" % (label + i), txn=txns[i % 3]) for i in range(6)))
            label += 6
            say(f"SENT {label}")


async def main(data_dir: str, seed: int, kill_point: str) -> None:
    if kill_point == "appends":
        await appends(data_dir)
        return
    rng = random.Random(seed)
    async with Broker.embedded(data_dir, sync=True) as broker:
        producer = await broker.create_producer(SEGMENT)
        consumer = await broker.subscribe(SEGMENT, SUB, consumer_type="shared", initial_position="earliest",
                                          receiver_queue_size=10_000)
        ids = []
        for label in range(6):
            ids.append(await producer.send(b"p%d" % label))
            say(f"PLAIN {label}")
        arm(kill_point, rng.randint(1, 3))
        label = 100
        for _ in range(8):
            txn = await broker.new_transaction(timeout_ms=600_000, version=5)
            least = txn.txn_id.least_bits
            for _ in range(rng.randint(1, 3)):
                await producer.send(b"t%d" % label, txn=txn)
                say(f"SENT {least} {label}")
                label += 1
            plain = rng.randrange(len(ids))
            try:
                await consumer.acknowledge(ids[plain], txn=txn)
                say(f"ACKED {least} {plain}")
            except Exception:
                pass                              # reserved by an earlier txn: a conflict
            action = rng.choice([TxnAction.COMMIT, TxnAction.ABORT])
            say(f"ENDING {least} {action.name}")
            await broker.service.coordinator.end_transaction(txn.txn_id, action)
            await asyncio.sleep(0.01)
        await asyncio.sleep(1)
    say("DONE")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
