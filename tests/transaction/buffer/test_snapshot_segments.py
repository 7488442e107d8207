"""Segmented transaction-buffer snapshots (PIP-196): sealed segments of aborts are written once,
the snapshot record (the index) holds only the aborts no segment holds, recovery loads the
segments, and a trim deletes the segments of the ledgers it deletes."""

from __future__ import annotations

import pytest

from core_ext.poskeys import pack_i64
from pyengine.storage import ManagedLedgerConfig
from pyengine.storage.errors import CorruptRecordError
from pyengine.storage.reader import StoreReader
from pyengine.transaction.buffer.config import TopicTransactionBufferConfig
from pyengine.transaction.buffer.snapshot import SnapshotSegment, SnapshotStore, TransactionBufferSnapshot
from pyengine_kernels import AbortedTxnSet, Position, TxnId
from spark_udfs.state import compute_topic_state
from tests.transaction.buffer.helpers import (
    crash_and_reopen,
    open_buffer,
    shut,
    stored_snapshot_records,
    visible_positions,
)

SEGMENT = 4
CONFIG = TopicTransactionBufferConfig(snapshot_segment_aborts=SEGMENT, snapshot_max_txn_count=10**6,
                                      snapshot_min_interval_ms=3_600_000)
LEDGERS = ManagedLedgerConfig(max_entries_per_ledger=10)


async def abort_some(buffer, first_least: int, count: int) -> list[Position]:
    """`count` txns of one entry each, all aborted; their entries' positions."""
    positions = []
    for least in range(first_least, first_least + count):
        positions.append(await buffer.append(TxnId(1, least), b"x"))
        await buffer.abort(TxnId(1, least), -1)
    return positions


async def test_snapshots_write_each_sealed_segment_once_and_the_index_stays_small(reopen):
    env = reopen()
    ledger, buffer = await open_buffer(env, CONFIG, LEDGERS)
    written_segments: dict[bytes, bytes] = {}
    for round_ in range(10):
        await abort_some(buffer, 10 * round_, 10)
        await buffer.take_snapshot()
        index, segments = stored_snapshot_records(env, ledger.topic_id)
        # The index holds fewer aborts than a segment; the segments hold the others.
        assert len(AbortedTxnSet.from_bytes(index.aborted)) < SEGMENT
        assert sum(s.aborted_count for s in index.segments) + len(AbortedTxnSet.from_bytes(index.aborted)) \
            == 10 * (round_ + 1)
        assert len(segments) == len(index.segments)
        for key, value in written_segments.items():     # never rewritten, never changed
            assert segments[key] == value
        written_segments = segments
    # A snapshot write puts the index alone once its segments are durable.
    puts = []

    class Recording:
        def put(self, key, value, db=None):
            puts.append(key)

        def delete(self, key, db=None):
            raise AssertionError("nothing to delete")

    snapshot = TransactionBufferSnapshot(buffer.max_read_position(), buffer.aborted)
    SnapshotStore(env, ledger.topic_id, segment_aborts=SEGMENT).write_of(snapshot)(Recording())
    assert puts == [pack_i64(ledger.topic_id)]
    store = buffer._snapshots
    store.write_of(snapshot, seal=True)(Recording())
    assert puts[1:] == [pack_i64(ledger.topic_id)]
    visible = visible_positions(ledger, buffer)

    env, ledger, buffer = await crash_and_reopen(env, reopen, ledger, CONFIG, LEDGERS)
    assert buffer.stats()["recover_replayed_entries"] == 0
    assert len(buffer.aborted) == 100
    assert visible_positions(ledger, buffer) == visible == set()
    await shut(ledger, buffer)


async def test_aborts_above_the_read_horizon_stay_unsealed(reopen):
    """A txn still open holds the read position back: aborts after it are not sealed (a later
    abort could still land below them), and come back by the replay after a restart."""
    env = reopen()
    ledger, buffer = await open_buffer(env, CONFIG, LEDGERS)
    await abort_some(buffer, 0, 5)
    await buffer.append(TxnId(2, 1), b"open")
    await abort_some(buffer, 5, 9)
    await buffer.take_snapshot()
    index, segments = stored_snapshot_records(env, ledger.topic_id)
    horizon = buffer.max_read_position()
    assert [s.aborted_count for s in index.segments] == [SEGMENT]        # 5 below the horizon: one segment
    assert all(Position(s.last_marker_ledger_id, s.last_marker_entry_id) <= horizon for s in index.segments)
    assert len(AbortedTxnSet.from_bytes(index.aborted)) == 14 - SEGMENT
    env, ledger, buffer = await crash_and_reopen(env, reopen, ledger, CONFIG, LEDGERS)
    assert len(buffer.aborted) == 14
    assert {(t.most_bits, t.least_bits) for t, _ in buffer.ongoing_txns()} == {(2, 1)}
    await buffer.commit(TxnId(2, 1), -1)
    assert len(visible_positions(ledger, buffer)) == 1                    # the committed entry alone
    await shut(ledger, buffer)


async def test_a_segment_sealed_by_a_failed_commit_is_carried_by_the_next_snapshot(reopen):
    from tests.transaction.buffer.test_topic_buffer import fail_next_commit

    env = reopen()
    ledger, buffer = await open_buffer(env, CONFIG, LEDGERS)
    await abort_some(buffer, 0, SEGMENT + 1)
    fail_next_commit(env)
    with pytest.raises(Exception, match="injected"):
        await buffer.take_snapshot()
    await buffer.take_snapshot()
    index, segments = stored_snapshot_records(env, ledger.topic_id)
    assert [s.aborted_count for s in index.segments] == [SEGMENT] and len(segments) == 1
    env, ledger, buffer = await crash_and_reopen(env, reopen, ledger, CONFIG, LEDGERS)
    assert len(buffer.aborted) == SEGMENT + 1 and buffer.stats()["recover_replayed_entries"] == 0
    await shut(ledger, buffer)


async def test_a_trim_deletes_the_segments_of_its_ledgers(reopen):
    env = reopen()
    ledger, buffer = await open_buffer(env, CONFIG, LEDGERS)
    cursor = await ledger.open_cursor("sub", "earliest")
    positions = await abort_some(buffer, 0, 20)          # 40 entries with the markers: 4 ledgers
    await buffer.take_snapshot()
    index, segments = stored_snapshot_records(env, ledger.topic_id)
    assert len(segments) == 20 // SEGMENT
    await cursor.ack_cumulative(positions[9])
    ledger.set_retention(0, -1)
    deleted = await ledger.trim(now_ms=1 << 62)
    assert deleted
    first = ledger.first_position()
    index, segments = stored_snapshot_records(env, ledger.topic_id)
    lasts = [Position(s.last_marker_ledger_id, s.last_marker_entry_id) for s in index.segments]
    assert lasts and all(last >= first for last in lasts) and len(segments) == len(lasts)
    assert [s.last_marker for s in buffer._snapshots.segments] == lasts
    aborted = len(buffer.aborted)
    env, ledger, buffer = await crash_and_reopen(env, reopen, ledger, CONFIG, LEDGERS)
    assert len(buffer.aborted) == aborted and buffer.stats()["recover_replayed_entries"] == 0
    await shut(ledger, buffer)


def _index_with(segment: SnapshotSegment, aborted: AbortedTxnSet) -> bytes:
    return TransactionBufferSnapshot(Position(9, 9), AbortedTxnSet()).encode(unsealed=aborted, segments=(segment,))


def test_a_missing_segment_is_corruption_unless_a_trim_took_its_ledgers():
    segment = SnapshotSegment(Position(3, 7), 2)
    raw = _index_with(segment, AbortedTxnSet())
    with pytest.raises(CorruptRecordError, match="segment ending at 3:7 is missing"):
        TransactionBufferSnapshot.decode(raw, lambda last: None, Position(3, 7))
    loaded = TransactionBufferSnapshot.decode(raw, lambda last: None, Position(4, 0))
    assert len(loaded.aborted) == 0 and loaded.segments == ()


@pytest.mark.parametrize("stored", [
    [(TxnId(1, 1), Position(3, 2))],                             # one abort where the index says two
    [(TxnId(1, 1), Position(3, 2)), (TxnId(1, 2), Position(3, 5))],    # ends before 3:7
])
def test_a_segment_that_differs_from_its_index_entry_is_corruption(stored):
    part = AbortedTxnSet()
    for txn, marker in stored:
        part.add(txn, marker)
    raw = _index_with(SnapshotSegment(Position(3, 7), 2), AbortedTxnSet())
    with pytest.raises(CorruptRecordError, match="does not hold what the index says"):
        TransactionBufferSnapshot.decode(raw, lambda last: part.to_bytes())
    with pytest.raises(CorruptRecordError, match="segment"):
        TransactionBufferSnapshot.decode(raw, lambda last: b"not an aborted set")


def test_segment_size_must_be_a_positive_int(tmp_path):
    with pytest.raises(ValueError, match="snapshot_segment_aborts"):
        TopicTransactionBufferConfig(snapshot_segment_aborts=0)
    with pytest.raises(ValueError, match="segment_aborts"):
        SnapshotStore(None, 1, segment_aborts=True)


async def test_the_read_only_state_of_the_spark_source_reads_the_segments(tmp_path):
    from pyengine.storage import StorageEnvironment

    env = StorageEnvironment(tmp_path, sync=False)
    ledger, buffer = await open_buffer(env, CONFIG, LEDGERS)
    await abort_some(buffer, 0, 3 * SEGMENT)
    await buffer.append(TxnId(1, 99), b"committed")
    await buffer.commit(TxnId(1, 99), -1)
    await buffer.take_snapshot()
    index, _ = stored_snapshot_records(env, ledger.topic_id)
    assert len(index.segments) == 3
    await shut(ledger, buffer)
    env.close()
    with StoreReader(tmp_path) as reader, reader.view() as view:
        info = view.topic(ledger.name)
        state = compute_topic_state(view, info)
    assert AbortedTxnSet.from_bytes(state.aborted) == buffer.aborted
