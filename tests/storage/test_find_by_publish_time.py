"""A seek by publish time finds its entry by a binary search (as Pulsar's broker does), not by
reading the whole topic: the same answer as a scan where publish times do not go back, in
about log2(entries) reads."""

import asyncio
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from pyengine.storage import ManagedLedger, ManagedLedgerConfig, StorageEnvironment
from pyengine_kernels import Position

TOPIC = "persistent://public/default/t"


def scanned(ml: ManagedLedger, timestamp_ms: int) -> Position:
    """The reference: the first stored entry published at or after `timestamp_ms`."""
    for entry in ml.read_entries(Position(-1, -1), 1_000_000):
        if entry.publish_time >= timestamp_ms:
            return entry.position
    return ml.lac.next()


@settings(max_examples=40, deadline=None)
@given(gaps=st.lists(st.lists(st.integers(0, 3), max_size=8), min_size=1, max_size=6),
       per_ledger=st.integers(1, 6), trimmed=st.integers(0, 30), reopened=st.booleans(),
       probes=st.lists(st.integers(0, 120), min_size=1, max_size=10))
def test_the_search_finds_what_a_scan_finds(tmp_path_factory, gaps, per_ledger, trimmed, reopened, probes):
    """Batches of entries with non-decreasing publish times, over ledgers rolled by count, some
    ledgers trimmed, the ledger reopened (an empty current ledger after closed ones)."""

    async def check() -> None:
        path = tmp_path_factory.mktemp("find")
        config = ManagedLedgerConfig(max_entries_per_ledger=per_ledger, retention_ms=0)
        env = StorageEnvironment(path)
        try:
            ml = await ManagedLedger.open(env, TOPIC, config)
            published, positions = 1, []
            for batch in gaps:
                for gap in batch:
                    published += gap
                    positions.append(await ml.append_entry(b"m", publish_time=published)[1])
            if positions and trimmed:
                cursor = await ml.open_cursor("sub", "earliest")
                await cursor.ack_cumulative(positions[min(trimmed, len(positions)) - 1])
                await ml.trim()
            if reopened:
                await ml.close()
                env.close()
                env = StorageEnvironment(path)
                ml = await ManagedLedger.open(env, TOPIC, config)
            while ml._trimming is not None:
                # A background trim (retention 0) commits from the writer thread: landing between
                # the search and the scan, it would change what they read.
                await asyncio.sleep(0.001)
            for timestamp in probes:
                assert ml.find_by_publish_time(timestamp) == scanned(ml, timestamp), timestamp
        finally:
            env.close()

    asyncio.run(check())


class CountingReads:
    """A storage environment whose read transactions count the entries they read."""

    def __init__(self, env: StorageEnvironment) -> None:
        self.env, self.gets = env, 0

    def read(self):
        counter = self

        class Txn:
            def __init__(self, txn) -> None:
                self.txn = txn

            def __enter__(self):
                self.txn.__enter__()
                return self

            def __exit__(self, *exc):
                return self.txn.__exit__(*exc)

            def get(self, *args, **kwargs):
                counter.gets += 1
                return self.txn.get(*args, **kwargs)

            def cursor(self, *args, **kwargs):
                counter.gets += 1000        # a range read (a scan reads 1000 entries at a time)
                return self.txn.cursor(*args, **kwargs)

        return Txn(self.env.read())


async def test_the_search_reads_about_log2_entries(env):
    ml = await ManagedLedger.open(env, TOPIC, ManagedLedgerConfig(max_entries_per_ledger=1000))
    entries = 20_000
    for start in range(0, entries, 2000):
        await ml.append_batch([b"m"] * 2000, publish_time=start // 2000 + 10)
    counting = CountingReads(env)
    ml.env = counting
    assert ml.find_by_publish_time(15) == Position(ml.first_position().ledger_id + 10, 0)
    assert ml.find_by_publish_time(10_000) == ml.lac.next()
    assert counting.gets <= 2 * (math.ceil(math.log2(entries)) + 1)
