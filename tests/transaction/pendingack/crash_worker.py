"""Child process of the kill -9 test: transactions acknowledge and end on one subscription,
concurrently, reporting each durable step on stdout, until the parent kills it.

Transaction i (TxnId(1, i)) acknowledges entries 3i and 3i+1 whole and indexes {0, 2} of the
4-message batch 3i+2 in one request, then commits (even i) or aborts (odd i).
Usage: python -m tests.transaction.pendingack.crash_worker DATA_DIR TXNS WORKERS
"""

from __future__ import annotations

import asyncio
import sys

from pyengine.storage import StorageEnvironment
from pyengine.transaction.pendingack import IndividualAck
from pyengine_kernels import TxnId
from tests.transaction.pendingack.helpers import acking, open_subscription

BATCH_SIZE = 4
BATCH_INDEXES = (0, 2)


def txn_acks(positions, i: int) -> list[IndividualAck]:
    return [IndividualAck(positions[3 * i]), IndividualAck(positions[3 * i + 1]),
            IndividualAck(positions[3 * i + 2], BATCH_SIZE, tuple(acking(BATCH_SIZE, *BATCH_INDEXES)))]


async def main(path: str, txns: int, workers: int) -> None:
    env = StorageEnvironment(path)
    sub = await open_subscription(env)
    handle = sub.handle

    async def worker(first: int) -> None:
        for i in range(first, txns, workers):
            txn = TxnId(1, i)
            await handle.individual_ack(txn, txn_acks(sub.positions, i))
            print(f"acked {i}", flush=True)
            if i % 2 == 0:
                await handle.commit(txn, -1)
            else:
                await handle.abort(txn, -1)
            print(f"ended {i}", flush=True)

    await asyncio.gather(*(worker(w) for w in range(workers)))
    print("done", flush=True)
    await asyncio.Event().wait()          # stay alive until killed


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
