"""`ManagedLedger.position_after` (the n-th entry after a position, counted over the ledgers'
spans without reading entries) and `ManagedCursor.acked_between` (individually acknowledged
entries in a range), checked against the stored entries themselves across ledger rollovers,
reopens (which leave empty ledgers), trimmed ledgers and positions between or beyond them."""

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from pyengine.storage import ManagedLedger, ManagedLedgerConfig, StorageEnvironment
from pyengine_kernels import Position

TOPIC = "persistent://public/default/counted"


@settings(max_examples=40, deadline=None)
@given(runs=st.lists(st.integers(0, 7), min_size=1, max_size=4), per_ledger=st.integers(1, 4),
       trim_upto=st.integers(0, 20), probes=st.lists(st.tuples(st.integers(0, 30), st.integers(-1, 5),
                                                               st.integers(1, 25)), min_size=1, max_size=12))
def test_position_after_is_the_nth_stored_entry_after(tmp_path_factory, runs, per_ledger, trim_upto, probes):
    async def check() -> None:
        path = tmp_path_factory.mktemp("counted")
        config = ManagedLedgerConfig(max_entries_per_ledger=per_ledger, retention_ms=0, retention_bytes=0)
        for run in runs:                       # each run is one open: a reopen starts a new ledger
            env = StorageEnvironment(path)
            try:
                ml = await ManagedLedger.open(env, TOPIC, config)
                for _ in range(run):
                    await ml.append(b"x")
                await ml.close()
            finally:
                env.close()
        env = StorageEnvironment(path)
        try:
            ml = await ManagedLedger.open(env, TOPIC, config)
            stored = [e.position for e in ml.read_entries(Position(-1, -1), 1000)]
            known = set(ml.ledgers)             # trimmed ones too: positions in them are asked about
            if stored:                          # consume and trim some whole ledgers
                cursor = await ml.open_cursor("sub", "earliest")
                await cursor.ack_cumulative(stored[min(trim_upto, len(stored) - 1)])
                await ml.trim()
            stored = [e.position for e in ml.read_entries(Position(-1, -1), 1000)]
            ledgers = sorted({*known, *ml.ledgers})
            for ledger_index, entry_id, count in probes:
                ledger_id = ledgers[ledger_index % len(ledgers)] if ledgers else 1
                after = Position(ledger_id, entry_id)
                following = [p for p in stored if p > after]
                expected = following[count - 1] if count <= len(following) else None
                assert ml.position_after(after, count) == expected, (after, count, stored)
        finally:
            env.close()

    asyncio.run(check())


@settings(max_examples=40, deadline=None)
@given(entries=st.integers(1, 14), per_ledger=st.integers(1, 4), acked=st.sets(st.integers(0, 13)),
       ranges=st.lists(st.tuples(st.integers(-1, 14), st.integers(-1, 14)), min_size=1, max_size=8))
def test_acked_between_counts_the_individual_acks_in_a_range(tmp_path_factory, entries, per_ledger, acked, ranges):
    async def check() -> None:
        env = StorageEnvironment(tmp_path_factory.mktemp("acked"))
        try:
            ml = await ManagedLedger.open(env, TOPIC, ManagedLedgerConfig(max_entries_per_ledger=per_ledger))
            positions = [await ml.append(b"x") for _ in range(entries)]
            cursor = await ml.open_cursor("sub", "earliest")
            chosen = [positions[i] for i in sorted(acked) if i < entries]
            if chosen:
                await cursor.ack(chosen)
            individually = {p for p in chosen if p > cursor.mark_delete}
            before_first = Position(positions[0].ledger_id, -1)
            bounds = [before_first, *positions]
            for low, high in ranges:
                after, upto = bounds[low % len(bounds)], bounds[high % len(bounds)]
                expected = sum(1 for p in individually if after < p <= upto)
                assert cursor.acked_between(after, upto) == expected, (after, upto, individually)
        finally:
            env.close()

    asyncio.run(check())
