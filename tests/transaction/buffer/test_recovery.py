"""Recovery and snapshots of TopicTransactionBuffer: restarts rebuild exactly the same view."""

import asyncio

import pytest

from pyengine.errors import NotAllowedError, ServiceNotReadyError
from pyengine.storage import CorruptRecordError, ManagedLedger, ManagedLedgerConfig, StorageError
from pyengine.transaction import TxnAction
from pyengine.transaction.buffer import BufferState
from pyengine.transaction.buffer.config import TopicTransactionBufferConfig
from pyengine.transaction.buffer.ended import EndedTxns
from pyengine.transaction.buffer.snapshot import SnapshotStore, TransactionBufferSnapshot
from pyengine.transaction.buffer.topic_buffer import TopicTransactionBuffer
from pyengine_kernels import AbortedTxnSet, Position, TxnId
from tests.transaction.buffer.helpers import TOPIC, open_buffer, shut, visible_positions


async def fill(ledger, buffer) -> dict[str, list[Position]]:
    """Plain entries, committed, aborted and still-open txns, interleaved."""
    kinds: dict[str, list[Position]] = {"plain": [], "committed": [], "aborted": [], "open": []}
    for round_ in range(5):
        base = round_ * 10
        kinds["plain"].append(await ledger.append(b"plain"))
        kinds["committed"].append(await buffer.append(TxnId(1, base + 1), b"c"))
        kinds["aborted"].append(await buffer.append(TxnId(2, base + 2), b"a"))
        kinds["plain"].append(await ledger.append(b"plain"))
        kinds["committed"].append(await buffer.append(TxnId(1, base + 1), b"c"))
        await buffer.commit(TxnId(1, base + 1), base)
        await buffer.abort(TxnId(2, base + 2), base + 1)
    kinds["open"].append(await buffer.append(TxnId(3, 1), b"o"))
    kinds["plain"].append(await ledger.append(b"plain behind the open txn"))
    return kinds


async def reopen_buffer(env, reopen, config=None, ledger=None, buffer=None, clean=True):
    """Stop (cleanly: final snapshot; or not: as if the process died after its last commit)
    and start again on the same data dir."""
    if clean:
        await shut(ledger, buffer)
    else:
        await ledger.close()
        await env.drain()
    env = reopen(env)
    ledger, buffer = await open_buffer(env, config)
    return env, ledger, buffer


@pytest.mark.parametrize("clean", [True, False])
@pytest.mark.parametrize("snapshots", [True, False])
async def test_a_restart_rebuilds_the_same_view(reopen, clean, snapshots):
    config = TopicTransactionBufferConfig(snapshots_enabled=snapshots)
    env = reopen()
    ledger, buffer = await open_buffer(env, config)
    kinds = await fill(ledger, buffer)
    before = visible_positions(ledger, buffer)
    horizon, aborted, ongoing = buffer.max_read_position(), buffer.aborted.items(), buffer.ongoing_txns()
    env, ledger, buffer = await reopen_buffer(env, reopen, config, ledger, buffer, clean)
    assert buffer.state is BufferState.READY
    assert visible_positions(ledger, buffer) == before
    assert buffer.max_read_position() == horizon
    assert buffer.aborted.items() == aborted
    assert buffer.ongoing_txns() == ongoing
    # Low watermarks are kept by snapshots only (markers do not carry them).
    if clean and snapshots:
        assert buffer.low_watermark(1) == 40 and buffer.low_watermark(2) == 41
    # The open txn ends after the restart; the rest was already decided.
    await buffer.commit(TxnId(3, 1), -1)
    assert visible_positions(ledger, buffer) == before | set(kinds["open"]) | {kinds["plain"][-1]}
    assert not visible_positions(ledger, buffer) & set(kinds["aborted"])


async def test_a_topic_that_never_held_txn_entries_recovers_without_replay(reopen):
    env = reopen()
    ledger, buffer = await open_buffer(env)
    for _ in range(20):
        await ledger.append(b"plain")
    env, ledger, buffer = await reopen_buffer(env, reopen, None, ledger, buffer)
    stats = buffer.stats()
    assert stats["recover_replayed_entries"] == 0
    assert buffer.max_read_position() == ledger.lac
    assert len(visible_positions(ledger, buffer)) == 20


async def test_recovery_replays_only_after_the_snapshot(reopen):
    env = reopen()
    ledger, buffer = await open_buffer(env)
    await fill(ledger, buffer)
    await buffer.commit(TxnId(3, 1), -1)
    await buffer.take_snapshot()
    snapshot_at = buffer.max_read_position()
    assert buffer.stats()["last_snapshot_position"] == str(snapshot_at)
    tail = [await ledger.append(b"after the snapshot") for _ in range(3)]
    tail.append(await buffer.append(TxnId(4, 1), b"open after the snapshot"))
    env, ledger, buffer = await reopen_buffer(env, reopen, None, ledger, buffer, clean=False)
    assert buffer.stats()["recover_replayed_entries"] == len(tail)
    assert buffer.stats()["last_snapshot_position"] == str(snapshot_at)
    assert dict(buffer.ongoing_txns()) == {TxnId(4, 1): tail[-1]}


async def test_an_end_after_a_restart_is_idempotent_and_late_writes_stay_refused(reopen):
    env = reopen()
    ledger, buffer = await open_buffer(env)
    committed, aborted = TxnId(1, 100), TxnId(1, 101)
    await buffer.append(committed, b"c")
    await buffer.append(aborted, b"a")
    await buffer.commit(committed, 50)
    await buffer.abort(aborted, 50)
    for clean in (True, False):
        env, ledger, buffer = await reopen_buffer(env, reopen, None, ledger, buffer, clean)
        entries = len(ledger.read_entries(Position.EARLIEST, 1000))
        await buffer.commit(committed, 50)                  # the coordinator retries after a restart
        await buffer.abort(aborted, 50)
        assert len(ledger.read_entries(Position.EARLIEST, 1000)) == entries
        for txn in (committed, aborted, TxnId(1, 50)):
            with pytest.raises(NotAllowedError):
                await buffer.append(txn, b"late")


async def test_recovery_reads_in_chunks_and_never_shows_more_than_it_verified(reopen):
    env = reopen()
    ledger, buffer = await open_buffer(env, TopicTransactionBufferConfig(snapshots_enabled=False))
    kinds = await fill(ledger, buffer)
    final_horizon = buffer.max_read_position()
    env, ledger, _ = await reopen_buffer(env, reopen, None, ledger, buffer, clean=False)
    buffer = TopicTransactionBuffer(ledger, TopicTransactionBufferConfig(replay_chunk_entries=2))
    reads = []
    original = ledger.read_entries

    def counting(start, max_entries, last=None):
        entries = original(start, max_entries, last)
        reads.append(len(entries))
        return entries

    ledger.read_entries = counting
    horizons = []
    buffer.add_listener(lambda: horizons.append((buffer.state, buffer.max_read_position())))
    await buffer.recover()
    assert reads and max(reads) <= 2
    assert sum(reads) == ledger.number_of_entries
    initializing = [h for state, h in horizons if state is BufferState.INITIALIZING]
    assert initializing == sorted(initializing)
    assert all(h <= final_horizon for h in initializing)
    assert all(h < kinds["open"][0] for _, h in horizons)
    assert buffer.max_read_position() == final_horizon


async def test_appends_during_recovery_are_queued_and_plain_ones_show_after_it(reopen):
    env = reopen()
    ledger, buffer = await open_buffer(env)
    await fill(ledger, buffer)
    await buffer.commit(TxnId(3, 1), -1)
    env, ledger, _ = await reopen_buffer(env, reopen, TopicTransactionBufferConfig(snapshots_enabled=False),
                                         ledger, buffer, clean=False)
    buffer = TopicTransactionBuffer(ledger, TopicTransactionBufferConfig(replay_chunk_entries=1))
    during: dict = {}
    horizons = []

    def publish_during_recovery() -> None:
        if buffer.state is BufferState.INITIALIZING:
            horizons.append(buffer.max_read_position())
            if not during:
                during["txn"] = buffer.append(TxnId(9, 1), b"during recovery")
                during["plain"] = ledger.append_entry(b"plain during recovery")

    buffer.add_listener(publish_during_recovery)
    await buffer.recover()
    plain_position, plain_durable = during["plain"]
    await plain_durable
    assert len(horizons) > 2 and all(h < plain_position for h in horizons)   # Pulsar #12382
    assert buffer.max_read_position() == plain_position                       # Pulsar #14097
    position = await during["txn"]
    assert position > plain_position and dict(buffer.ongoing_txns()) == {TxnId(9, 1): position}


async def test_a_corrupt_snapshot_fails_recovery_which_can_be_retried(reopen):
    env = reopen()
    ledger, buffer = await open_buffer(env)
    await buffer.append(TxnId(1, 1), b"x")
    await shut(ledger, buffer)
    env = reopen(env)
    ledger = await ManagedLedger.open(env, TOPIC)
    store = SnapshotStore(env, ledger.topic_id)
    await env.submit(lambda txn: txn.put(store.key, b"\xff garbage", db=env.db("tb_snapshots")))
    buffer = TopicTransactionBuffer(ledger)
    queued = buffer.append(TxnId(1, 2), b"queued")
    with pytest.raises(CorruptRecordError):
        await buffer.recover()
    assert buffer.state is BufferState.NONE
    with pytest.raises(ServiceNotReadyError):
        await queued
    await env.submit(lambda txn: txn.delete(store.key, db=env.db("tb_snapshots")))
    await buffer.recover()                                   # full replay instead
    assert [t for t, _ in buffer.ongoing_txns()] == [TxnId(1, 1)]


async def test_a_retried_recovery_counts_only_its_own_replayed_entries(reopen, monkeypatch):
    """`recover_replayed_entries` (the admin stats' recoverReplayedEntries) is the last
    recovery's count: a recovery that failed part way does not add to the retry's."""
    env = reopen()
    ledger, buffer = await open_buffer(env, TopicTransactionBufferConfig(snapshots_enabled=False))
    for least in range(5):
        await buffer.append(TxnId(1, least), b"x")
    await shut(ledger, buffer)
    env = reopen(env)
    ledger = await ManagedLedger.open(env, TOPIC)
    buffer = TopicTransactionBuffer(ledger, TopicTransactionBufferConfig(snapshots_enabled=False,
                                                                         replay_chunk_entries=1))
    replay_entry, calls = buffer._replay_entry, []

    def fail_on_the_third(entry):
        calls.append(entry)
        if len(calls) == 3:
            raise StorageError("read failed")
        replay_entry(entry)

    monkeypatch.setattr(buffer, "_replay_entry", fail_on_the_third)
    with pytest.raises(StorageError):
        await buffer.recover()
    await buffer.recover()
    assert buffer.stats()["recover_replayed_entries"] == 5


async def test_snapshot_every_n_ended_txns(env):
    ledger, buffer = await open_buffer(env, TopicTransactionBufferConfig(snapshot_max_txn_count=3,
                                                                        snapshot_min_interval_ms=3_600_000))
    await buffer.append(TxnId(1, 0), b"x")
    await env.barrier()
    store = SnapshotStore(env, ledger.topic_id)
    first = store.load().max_read_position                 # the first snapshot, before any end
    positions = []
    for least in range(3):
        await buffer.commit(TxnId(1, least), -1)
        positions.append(buffer.max_read_position())
        await env.barrier()
        assert store.load().max_read_position == (first if least < 2 else positions[-1])
    assert first < positions[-1]
    assert buffer.stats()["last_snapshot_position"] == str(positions[-1])


async def test_snapshot_on_a_timer_also_without_any_end(env):
    ledger, buffer = await open_buffer(env, TopicTransactionBufferConfig(snapshot_min_interval_ms=20))
    await buffer.append(TxnId(1, 0), b"x")
    await buffer.commit(TxnId(1, 0), -1)
    plain = await ledger.append(b"plain only")
    store = SnapshotStore(env, ledger.topic_id)
    for _ in range(100):
        await asyncio.sleep(0.02)
        snapshot = store.load()
        if snapshot is not None and snapshot.max_read_position == plain:
            break
    assert store.load().max_read_position == plain


async def test_snapshots_round_trip_and_the_latest_wins(env):
    ledger, buffer = await open_buffer(env)
    store = SnapshotStore(env, ledger.topic_id)
    aborted = AbortedTxnSet()
    aborted.add(TxnId(1, 5), Position(3, 4))
    ended = EndedTxns()
    ended.advance_low_watermark(1, 3)
    ended.add(TxnId(1, 4), TxnAction.COMMIT)
    ended.add(TxnId(1, 5), TxnAction.ABORT)
    ended.add(TxnId(1, 2), TxnAction.COMMIT)              # below the watermark: not kept
    futures = [store.save(TransactionBufferSnapshot(Position(2, i), aborted, ended, i)) for i in range(5)]
    await asyncio.gather(*futures)
    loaded = store.load()
    assert loaded.max_read_position == Position(2, 4) and loaded.taken_ms == 4
    assert loaded.aborted == aborted
    assert list(loaded.ended.items()) == [(1, 3, {4: TxnAction.COMMIT, 5: TxnAction.ABORT})]


def test_a_corrupt_snapshot_record_is_reported():
    with pytest.raises(CorruptRecordError):
        TransactionBufferSnapshot.decode(b"\x08\x01")        # required fields missing


async def test_replay_keeps_a_txn_ended_although_an_entry_follows_its_marker(reopen):
    """Pulsar accepts a late write below no watermark; this buffer refuses it, but a ledger may
    still hold one (written by another broker version). Replay must not reopen the txn."""
    env = reopen()
    ledger, buffer = await open_buffer(env)
    txn = TxnId(1, 1)
    first = await buffer.append(txn, b"x")
    await buffer.abort(txn, -1)
    late = await ledger.append(b"late", txn_most=1, txn_least=1)   # straight into the ledger
    plain = await ledger.append(b"plain")
    env, ledger, buffer = await reopen_buffer(env, reopen, None, ledger, buffer, clean=False)
    assert buffer.ongoing_txns() == []
    assert buffer.max_read_position() == ledger.lac
    assert visible_positions(ledger, buffer) == {plain}
    assert first not in visible_positions(ledger, buffer) and late not in visible_positions(ledger, buffer)


async def test_closing_during_recovery_stops_it(reopen):
    env = reopen()
    ledger, buffer = await open_buffer(env, TopicTransactionBufferConfig(snapshots_enabled=False))
    for least in range(10):
        await buffer.append(TxnId(1, least), b"x")
    env, ledger, _ = await reopen_buffer(env, reopen, None, ledger, buffer, clean=False)
    buffer = TopicTransactionBuffer(ledger, TopicTransactionBufferConfig(replay_chunk_entries=1))
    recovery = asyncio.ensure_future(buffer.recover())
    await asyncio.sleep(0)
    assert buffer.state is BufferState.INITIALIZING
    commit = asyncio.ensure_future(buffer.commit(TxnId(1, 1), -1))     # waits for the recovery
    await buffer.close()
    with pytest.raises(ServiceNotReadyError):
        await recovery
    with pytest.raises(ServiceNotReadyError):
        await commit
    assert buffer.stats()["recover_replayed_entries"] < 10


async def test_a_txn_whose_marker_was_trimmed_stays_ended_after_a_crash(reopen):
    """Trimming deletes markers that told which txns ended here; what they told must survive in
    a snapshot, or a late write of such a txn would be taken for a new one after a crash."""
    config = ManagedLedgerConfig(max_entries_per_ledger=2, retention_ms=0)
    env = reopen()
    ledger, buffer = await open_buffer(env, TopicTransactionBufferConfig(snapshot_min_interval_ms=3_600_000),
                                       config)
    cursor = await ledger.open_cursor("sub", "earliest")
    ended = [TxnId(1, 1), TxnId(1, 2)]
    await buffer.append(ended[0], b"x")
    await buffer.abort(ended[0], -1)
    await buffer.commit(ended[1], -1)
    for _ in range(4):
        await ledger.append(b"plain")
    first = ledger.first_position()
    await cursor.ack_cumulative(buffer.max_read_position())
    await ledger.trim(now_ms=1 << 62)          # (the ack may have started trimming already)
    assert ledger.first_position() > first
    assert all(not e.is_marker for e in ledger.read_entries(Position.EARLIEST, 100))
    await ledger.close()
    await env.drain()
    env = reopen(env)
    ledger, buffer = await open_buffer(env, None, config)
    for txn in ended:
        with pytest.raises(NotAllowedError):
            await buffer.append(txn, b"late")


async def _end_txns_then_trim_their_ledger(env, ledger, buffer):
    """An aborted and a committed txn whose markers lie in a ledger then trimmed, with no
    snapshot taken between their ends and the trim (only the first one, before them)."""
    cursor = await ledger.open_cursor("sub", "earliest")
    aborted, committed = TxnId(1, 1), TxnId(1, 2)
    await buffer.append(aborted, b"a")
    await buffer.abort(aborted, -1)
    await buffer.append(committed, b"c")
    await buffer.commit(committed, -1)
    for _ in range(3):
        await ledger.append(b"plain")
    stored = SnapshotStore(env, ledger.topic_id).load()
    assert stored is not None and not stored.ended.outcome(aborted) and not stored.ended.outcome(committed)
    first = ledger.first_position()
    await cursor.ack_cumulative(buffer.max_read_position())
    ledger.set_retention(0, -1)
    return [aborted, committed], first


async def test_a_crash_right_after_a_trim_keeps_the_txns_its_markers_ended(reopen):
    """kill -9 just after a trim committed: whatever the trim made the buffer write afterwards
    (its snapshot) is lost. The txns that ended in the trimmed ledger must still be known as
    ended after the restart: a late write of them refused, none of them open."""
    config = ManagedLedgerConfig(max_entries_per_ledger=4)
    env = reopen()
    ledger, buffer = await open_buffer(
        env, TopicTransactionBufferConfig(snapshot_min_interval_ms=3_600_000), config)
    ended, first = await _end_txns_then_trim_their_ledger(env, ledger, buffer)
    await ledger.trim(now_ms=1 << 62)
    assert ledger.first_position() > first
    assert all(e.txn is None for e in ledger.read_entries(Position.EARLIEST, 100))
    env = reopen(env)           # at once: nothing queued after the trim's commit is written
    ledger, buffer = await open_buffer(env, None, config)
    assert buffer.ongoing_txns() == []
    for txn in ended:
        with pytest.raises(NotAllowedError):
            await buffer.append(txn, b"late")
    assert buffer.ongoing_txns() == []
    assert buffer.max_read_position() == ledger.lac
    await shut(ledger, buffer)


async def test_a_trim_during_recovery_waits_until_the_replay_read_what_it_deletes(reopen):
    """A recovering buffer does not know yet what the markers of entries it has not replayed
    tell: a trim that would delete them deletes nothing (its read horizon bounds the trim);
    once they are read, the trim goes ahead and its snapshot keeps what they told, also across
    a crash right after it."""
    config = ManagedLedgerConfig(max_entries_per_ledger=4)
    env = reopen()
    ledger, buffer = await open_buffer(
        env, TopicTransactionBufferConfig(snapshot_min_interval_ms=3_600_000), config)
    ended, first = await _end_txns_then_trim_their_ledger(env, ledger, buffer)
    env = reopen(env)           # a crash before any snapshot covers the ends
    ledger = await ManagedLedger.open(env, TOPIC, config)
    ledger.set_retention(0, -1)
    buffer = TopicTransactionBuffer(ledger, TopicTransactionBufferConfig(replay_chunk_entries=1))
    recovery = asyncio.ensure_future(buffer.recover())
    while buffer.stats()["recover_replayed_entries"] == 0:
        await asyncio.sleep(0)
    assert buffer.state is BufferState.INITIALIZING
    assert await ledger.trim(now_ms=1 << 62) == []
    assert ledger.first_position() == first
    await recovery
    assert await ledger.trim(now_ms=1 << 62)
    assert ledger.first_position() > first
    env = reopen(env)
    ledger, buffer = await open_buffer(env, None, config)
    for txn in ended:
        with pytest.raises(NotAllowedError):
            await buffer.append(txn, b"late")
    assert buffer.ongoing_txns() == []
    await shut(ledger, buffer)


async def test_a_trim_after_the_buffer_closed_still_keeps_what_its_markers_told(reopen):
    """The ledger may trim after its buffer closed (it closes later): the buffer, which knew
    everything when it closed, still writes the snapshot with the trim."""
    config = ManagedLedgerConfig(max_entries_per_ledger=4)
    env = reopen()
    ledger, buffer = await open_buffer(
        env, TopicTransactionBufferConfig(snapshot_min_interval_ms=3_600_000), config)
    ended, first = await _end_txns_then_trim_their_ledger(env, ledger, buffer)
    await buffer.close()
    assert await ledger.trim(now_ms=1 << 62)
    assert ledger.first_position() > first
    env = reopen(env)
    ledger, buffer = await open_buffer(env, None, config)
    for txn in ended:
        with pytest.raises(NotAllowedError):
            await buffer.append(txn, b"late")
    await shut(ledger, buffer)
