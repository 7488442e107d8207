"""Recovery of a big log: 100k finished txns (compact FINISHED records) and 100 open ones."""

from __future__ import annotations

import time

from pyengine.transaction import TxnAction, TxnStatus
from pyengine.transaction.coordinator import log_records as records
from pyengine_kernels import TxnId
from tests.transaction.coordinator.helpers import ServiceHarness

COORDINATORS = 16
FINISHED = 100_000
OPEN = 100


def write_log(env, now_ms: int) -> None:
    """A log as 16 coordinators leave it after FINISHED txns then OPEN ones, written directly
    in the store's format (building it through the API would dominate the test's time)."""
    db = env.db("txn_log")

    def write(txn):
        for cid in range(COORDINATORS):
            prefix = records.coordinator_prefix(cid)
            finished = range(cid, FINISHED, COORDINATORS)
            opened = range(cid, OPEN, COORDINATORS)
            log = 0
            for sequence, _ in enumerate(finished):
                status = TxnStatus.COMMITTED if sequence % 3 else TxnStatus.ABORTED
                txn.put(records.log_key(prefix, log),
                        records.finished_record(cid, sequence, status, now_ms - 5000, 60_000, now_ms - 1000), db=db)
                log += 1
            for sequence in range(len(finished), len(finished) + len(opened)):
                for value in (records.new_record(cid, sequence, 60_000, now_ms - 500),
                              records.add_partitions_record(cid, sequence, [f"topic-{sequence}"], now_ms - 400),
                              records.add_subscriptions_record(cid, sequence, [("topic", "sub")], now_ms - 300)):
                    txn.put(records.log_key(prefix, log), value, db=db)
                    log += 1
            header = records.encode_header(len(finished) + len(opened))
            txn.put(records.log_key(prefix, records.HEADER_SEQUENCE), header, db=db)

    env.write_now(write)


async def test_start_with_100k_finished_and_100_open_txns(data_dir, participants, clock):
    harness = ServiceHarness(data_dir, participants, clock, num_coordinators=COORDINATORS)
    await harness.start()
    await harness.stop()
    from pyengine.storage import StorageEnvironment
    env = StorageEnvironment(data_dir)
    write_log(env, clock())
    env.close()

    started = time.perf_counter()
    service = await harness.start()
    elapsed = time.perf_counter() - started
    print(f"start() with {FINISHED} finished and {OPEN} open txns: {elapsed * 1000:.0f} ms")
    assert elapsed < 5, f"recovery took {elapsed:.1f} s"

    stats = service.stats()
    assert stats.by_status[TxnStatus.OPEN] == OPEN and stats.pending_timeouts == OPEN
    assert stats.by_status[TxnStatus.COMMITTED] + stats.by_status[TxnStatus.ABORTED] == FINISHED
    last_finished = TxnId(3, FINISHED // COORDINATORS - 1)
    assert await service.end_transaction(last_finished, service.get(last_finished).status.outcome)
    open_txn = TxnId(3, FINISHED // COORDINATORS)
    assert service.get(open_txn).partitions == [f"topic-{open_txn.least_bits}"]
    assert service.store(3).low_watermark() == open_txn.least_bits - 1
    assert await service.end_transaction(open_txn, TxnAction.COMMIT) == TxnStatus.COMMITTED
    assert participants.told(open_txn) == {f"topic-{open_txn.least_bits}": {TxnAction.COMMIT},
                                           ("topic", "sub"): {TxnAction.COMMIT}}
    assert (await service.new_transaction(3, 1000)).least_bits == open_txn.least_bits + 7
    await harness.stop()
