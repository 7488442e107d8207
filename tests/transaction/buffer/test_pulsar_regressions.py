"""One test per Apache Pulsar transaction-buffer bug this buffer avoids (named by number)."""

import asyncio

import pytest

from core_ext.poskeys import pack_i64, pack_position
from pyengine.errors import NotAllowedError
from pyengine.storage import ManagedLedger, ManagedLedgerConfig
from pyengine.transaction import TxnAction
from pyengine.transaction.buffer import BufferState
from pyengine.transaction.buffer.config import TopicTransactionBufferConfig
from pyengine.transaction.buffer.ended import EndedTxns
from pyengine.transaction.buffer.markers import marker_entry
from pyengine.transaction.buffer.snapshot import DEFAULT_SEGMENT_ABORTS, SnapshotStore, TransactionBufferSnapshot
from pyengine.transaction.buffer.topic_buffer import TXN_PROPERTY, TopicTransactionBuffer
from pyengine_kernels import AbortedTxnSet, Position, TxnId
from tests.transaction.buffer.helpers import (
    TOPIC,
    crash_and_reopen,
    open_buffer,
    shut,
    stored_snapshot_records,
    visible_positions,
)

SMALL_LEDGERS = ManagedLedgerConfig(max_entries_per_ledger=4)      # nothing trimmed unless a test asks


async def test_pulsar_12219_recovery_without_any_abort_uses_the_snapshot(reopen):
    """#12219: snapshots were taken only after an abort, so a topic that only ever committed
    replayed from its first entry after every restart."""
    env = reopen()
    config = TopicTransactionBufferConfig(snapshot_max_txn_count=10)
    ledger, buffer = await open_buffer(env, config)
    for least in range(55):
        await buffer.append(TxnId(1, least), b"x")
        await buffer.commit(TxnId(1, least), least - 1)
    assert buffer.stats()["aborted_total"] == 0
    total = ledger.number_of_entries
    env, ledger, buffer = await crash_and_reopen(env, reopen, ledger, config)
    replayed = buffer.stats()["recover_replayed_entries"]
    assert replayed <= 2 * 5, f"replayed {replayed} of {total} entries: the snapshot was not used"
    assert buffer.max_read_position() == ledger.lac
    assert buffer.low_watermark(1) >= 48


async def test_pulsar_12494_recovery_from_a_snapshot_in_a_deleted_ledger_terminates(reopen):
    """#12494 / #11318: recovery met a deleted ledger ("No such ledger") and failed or looped
    forever. Here the snapshot's max read position lies in a ledger trimmed since."""
    env = reopen()
    ledger, buffer = await open_buffer(env, ledger_config=SMALL_LEDGERS)
    cursor = await ledger.open_cursor("sub", "earliest")
    for least in range(3):
        await buffer.append(TxnId(1, least), b"x")
        await (buffer.commit if least % 2 else buffer.abort)(TxnId(1, least), least - 1)
    await buffer.take_snapshot()
    snapshot_position = SnapshotStore(env, ledger.topic_id).load().max_read_position
    for least in range(3, 12):
        await buffer.append(TxnId(2, least), b"y")
        await (buffer.commit if least % 2 else buffer.abort)(TxnId(2, least), least - 1)
    open_txn = await buffer.append(TxnId(3, 1), b"still open")
    await cursor.ack_cumulative(buffer.max_read_position())
    ledger.set_retention(0, -1)
    await ledger.trim(now_ms=1 << 62)
    assert snapshot_position.ledger_id not in ledger.ledgers
    before = visible_positions(ledger, buffer)
    env, ledger, buffer = await asyncio.wait_for(crash_and_reopen(env, reopen, ledger, None, SMALL_LEDGERS), 10)
    assert buffer.state is BufferState.READY
    assert visible_positions(ledger, buffer) == before
    assert dict(buffer.ongoing_txns()) == {TxnId(3, 1): open_txn}


async def test_pulsar_12494_a_ledger_deleted_under_the_replay_is_skipped(reopen):
    """#12494 / #11318, the other way round: a ledger disappears while recovery reads it (the
    shape of #18833 / #18970 too: entries gone between the replay's look at the LAC and its read)."""
    env = reopen()
    ledger, buffer = await open_buffer(env, TopicTransactionBufferConfig(snapshots_enabled=False),
                                       SMALL_LEDGERS)
    for least in range(10):
        await buffer.append(TxnId(1, least), b"x")
        await (buffer.commit if least % 2 else buffer.abort)(TxnId(1, least), -1)
    open_txn = await buffer.append(TxnId(2, 1), b"open")
    await ledger.close()
    await env.drain()
    env = reopen(env)
    ledger, _ = await open_buffer(env)
    buffer = TopicTransactionBuffer(ledger, TopicTransactionBufferConfig(replay_chunk_entries=3))
    doomed = sorted(ledger.ledgers)[1]
    original = ledger.read_entries
    reads = []

    def read_then_lose_a_ledger(start, max_entries, last=None):
        entries = original(start, max_entries, last)
        reads.append(start)
        if len(reads) == 1:                    # the next read would reach the doomed ledger
            info = ledger.ledgers.pop(doomed)
            keys = [pack_i64(ledger.topic_id) + pack_position(doomed, e) for e in range(info.last_entry_id + 1)]
            env.write_now(lambda txn: [txn.delete(k, db=env.db("entries")) for k in keys])
        return entries

    ledger.read_entries = read_then_lose_a_ledger
    await asyncio.wait_for(buffer.recover(), 10)
    assert buffer.state is BufferState.READY
    assert reads == sorted(set(reads))                     # always forward, never the same chunk twice
    assert dict(buffer.ongoing_txns()) == {TxnId(2, 1): open_txn}
    assert all(p.ledger_id != doomed for p in visible_positions(ledger, buffer))
    for entry in original(Position.EARLIEST, 1000):
        if entry.txn is not None and entry.txn.least_bits % 2 == 0 and not entry.is_marker:
            assert entry.position not in visible_positions(ledger, buffer)


async def test_pulsar_14097_horizon_follows_plain_publishes(reopen):
    """#14097: with transactions enabled, a consumer that never used them got nothing: plain
    publishes did not move the max read position (during recovery, and after a recovery that
    found no open txn)."""
    env = reopen()
    ledger, buffer = await open_buffer(env)
    await buffer.append(TxnId(1, 1), b"x")
    await buffer.commit(TxnId(1, 1), 0)
    env, ledger, buffer = await crash_and_reopen(env, reopen, ledger)
    assert buffer.max_read_position() == ledger.lac
    for _ in range(3):
        plain = await ledger.append(b"plain")
        assert buffer.max_read_position() == plain
    txn_entry = await buffer.append(TxnId(1, 2), b"t")
    behind = await ledger.append(b"plain behind an open txn")
    assert buffer.max_read_position() < txn_entry
    await buffer.commit(TxnId(1, 2), 1)
    assert buffer.max_read_position() == ledger.lac > behind
    after = await ledger.append(b"plain after")
    assert buffer.max_read_position() == after


async def test_pulsar_12382_horizon_is_right_before_recovery_completes(reopen):
    """#12382: plain publishes changed the max read position before recovery had finished,
    exposing entries of txns recovery had not found yet."""
    env = reopen()
    ledger, buffer = await open_buffer(env, TopicTransactionBufferConfig(snapshots_enabled=False))
    for _ in range(6):
        await ledger.append(b"plain")
    open_txn = await buffer.append(TxnId(1, 1), b"open")
    await ledger.close()
    await env.drain()
    env = reopen(env)
    ledger, _ = await open_buffer(env)              # a throw-away buffer just to open the ledger
    buffer = TopicTransactionBuffer(ledger, TopicTransactionBufferConfig(replay_chunk_entries=1))
    assert buffer.max_read_position() == Position.EARLIEST            # NONE: nothing verified
    seen = []

    def publish_and_look() -> None:
        if buffer.state is BufferState.INITIALIZING:
            seen.append(buffer.max_read_position())
            ledger.append(b"plain during recovery")

    buffer.add_listener(publish_and_look)
    await buffer.recover()
    assert seen and all(h < open_txn for h in seen)
    await env.barrier()
    assert buffer.max_read_position() < open_txn


async def test_pulsar_19200_a_txn_ended_via_low_watermark_does_not_freeze_the_horizon(reopen):
    """#19200: txns the coordinator ended during its recovery race never got their end on the
    topic; the max read position froze and snapshots stopped. Any later end from the same
    coordinator carries a low watermark above them: the buffer aborts them itself."""
    env = reopen()
    ledger, buffer = await open_buffer(env)
    stuck = await buffer.append(TxnId(1, 3), b"its end request is lost")
    behind = [await ledger.append(b"plain") for _ in range(3)]
    assert buffer.max_read_position() < stuck
    await buffer.append(TxnId(1, 7), b"y")
    await buffer.commit(TxnId(1, 7), 6)              # the coordinator: everything up to 6 ended
    assert buffer.max_read_position() == ledger.lac
    assert buffer.is_txn_aborted(TxnId(1, 3))
    assert stuck not in visible_positions(ledger, buffer)
    assert set(behind) <= visible_positions(ledger, buffer)
    await env.barrier()
    assert SnapshotStore(env, ledger.topic_id).load() is not None


async def test_pulsar_19200_low_watermark_from_the_snapshot_ends_stuck_txns_at_recovery(reopen):
    """The same after a crash between the watermark update and the automatic abort: recovery
    finds the txn open below the watermark it restored, and aborts it."""
    env = reopen()
    ledger, buffer = await open_buffer(env, TopicTransactionBufferConfig(snapshots_enabled=False))
    before = await ledger.append(b"plain")
    stuck = await buffer.append(TxnId(1, 3), b"stuck")
    ended = EndedTxns()
    ended.advance_low_watermark(1, 5)
    await SnapshotStore(env, ledger.topic_id).save(TransactionBufferSnapshot(before, AbortedTxnSet(), ended, 1))
    env, ledger, buffer = await crash_and_reopen(env, reopen, ledger)
    assert buffer.is_txn_aborted(TxnId(1, 3))
    assert buffer.max_read_position() == ledger.lac
    assert visible_positions(ledger, buffer) == {before}
    assert stuck not in visible_positions(ledger, buffer)


async def test_late_write_after_the_end_is_refused_and_never_visible(reopen):
    """A send delayed past its txn's end (client retry, slow connection) must not reopen the
    txn on the topic: refused here, after a restart, and when only the coordinator's low
    watermark knows that the txn ended."""
    env = reopen()
    ledger, buffer = await open_buffer(env)
    committed, timed_out = TxnId(1, 1), TxnId(1, 2)
    first = await buffer.append(committed, b"in time")
    await buffer.commit(committed, 0)
    with pytest.raises(NotAllowedError):
        await buffer.append(committed, b"late")
    # The coordinator aborted `timed_out` by timeout; its abort request to this topic is lost,
    # then its write arrives: accepted (nothing here says it ended) but held back ...
    late = await buffer.append(timed_out, b"late write of a timed-out txn")
    assert late not in visible_positions(ledger, buffer)
    # ... until the next end from that coordinator carries the low watermark past it.
    await buffer.commit(TxnId(1, 3), 2)
    assert buffer.is_txn_aborted(timed_out)
    with pytest.raises(NotAllowedError):
        await buffer.append(timed_out, b"later still")
    # After a clean stop the snapshot restores the watermark, which also covers txns that
    # never wrote here (TxnId(1, 0)); after a crash the markers tell which txns ended here.
    await shut(ledger, buffer)
    env = reopen(env)
    ledger, buffer = await open_buffer(env)
    for txn in (committed, timed_out, TxnId(1, 0)):
        with pytest.raises(NotAllowedError):
            await buffer.append(txn, b"late after a restart")
    env, ledger, buffer = await crash_and_reopen(env, reopen, ledger)
    for txn in (committed, timed_out):
        with pytest.raises(NotAllowedError):
            await buffer.append(txn, b"late after a crash")
    assert first in visible_positions(ledger, buffer)
    assert late not in visible_positions(ledger, buffer)


async def test_pulsar_14889_enabling_transactions_on_a_busy_topic_never_freezes_its_horizon(reopen):
    """#14889: once transactions were enabled every consumer of the broker was stuck; the
    buffer's stats showed its state and max read position no longer moving. Here a topic that
    held only plain entries takes its first txn (the buffer marks the topic transactional
    meanwhile), and the horizon and the state the stats report keep up with the LAC: before,
    while the txn is open, after its end, and after a crash."""
    env = reopen()
    ledger, buffer = await open_buffer(env)
    for _ in range(3):
        await ledger.append(b"before transactions")
    assert buffer.stats()["state"] == "ready" and buffer.max_read_position() == ledger.lac
    first_txn_entry, *_ = await asyncio.gather(buffer.append(TxnId(1, 1), b"first txn"),
                                               ledger.append(b"plain beside the first txn"))
    assert buffer.max_read_position() < first_txn_entry
    await buffer.commit(TxnId(1, 1), 0)
    for _ in range(2):
        plain = await ledger.append(b"plain after the commit")
        stats = buffer.stats()
        assert (stats["state"], stats["max_read_position"]) == ("ready", str(plain))
        assert stats["ongoing_txn_count"] == 0
    env, ledger, buffer = await crash_and_reopen(env, reopen, ledger)
    assert buffer.stats()["state"] == "ready" and buffer.max_read_position() == ledger.lac
    after = await ledger.append(b"plain after the crash")
    assert buffer.max_read_position() == after


async def reopened_for_a_racing_replay(env, reopen):
    """A topic of 5 small ledgers (alternate commits and aborts, then one txn left open) whose
    subscription consumed up to the open txn, reopened as after a crash with no snapshot: a
    buffer that has not recovered yet (one entry per replay step) and what was visible."""
    ledger, buffer = await open_buffer(env, TopicTransactionBufferConfig(snapshots_enabled=False), SMALL_LEDGERS)
    cursor = await ledger.open_cursor("sub", "earliest")
    for least in range(8):
        await buffer.append(TxnId(1, least), b"x")
        await (buffer.commit if least % 2 else buffer.abort)(TxnId(1, least), -1)
    open_txn = await buffer.append(TxnId(2, 1), b"open")
    for _ in range(40):
        await ledger.append(b"plain behind the open txn")
    await cursor.ack_cumulative(buffer.max_read_position())
    before = visible_positions(ledger, buffer)
    await ledger.close()
    await env.drain()
    env = reopen(env)
    ledger = await ManagedLedger.open(env, TOPIC, SMALL_LEDGERS)
    ledger.set_retention(0, -1)
    await ledger.open_cursor("sub", "earliest")
    buffer = TopicTransactionBuffer(ledger, TopicTransactionBufferConfig(replay_chunk_entries=1))
    return env, ledger, buffer, open_txn, before


def trim_when(buffer, ready_to_trim, monkeypatch) -> list:
    """Start a trim of `buffer`'s ledger at the first replay step where `ready_to_trim(verified)`
    holds, and hold the replay there until the trim has ended (the replay only yields between
    steps: without the hold it would finish before the trim's write commits). The list gets
    the trim's task and the buffer state when the trim deleted its ledgers."""
    started: list = []
    real_sleep = asyncio.sleep

    def maybe_trim() -> None:
        if not started and buffer.state is BufferState.INITIALIZING and ready_to_trim(buffer._verified):
            started.append(asyncio.ensure_future(buffer.ledger.trim(now_ms=1 << 62)))
            buffer.ledger.add_trim_listener(lambda _first: started.append(buffer.state))

    async def sleep_after_the_trim(delay, *args):
        if started and buffer.state is BufferState.INITIALIZING:
            await asyncio.wait([started[0]])
        return await real_sleep(delay, *args)

    buffer.add_listener(maybe_trim)
    monkeypatch.setattr(asyncio, "sleep", sleep_after_the_trim)
    return started


async def test_pulsar_18833_a_trim_racing_the_replay_cannot_take_entries_not_read_yet(reopen, monkeypatch):
    """#18833 / #18970: snapshot compaction deleted entries between the replay's "has more"
    and its read, and recovery blocked forever in readNext. Here a trim that would delete
    entries the replay has not read yet deletes nothing (the read horizon bounds it, and the
    buffer refuses what is past what it read) and is tried again later; the replay ends."""
    env, ledger, buffer, open_txn, before = await reopened_for_a_racing_replay(reopen(), reopen)
    first_ledger = min(ledger.ledgers)
    started = trim_when(buffer, lambda verified: verified.ledger_id == first_ledger, monkeypatch)
    await asyncio.wait_for(buffer.recover(), 10)
    assert buffer.state is BufferState.READY
    assert await started[0] == []
    assert min(ledger.ledgers) == first_ledger
    assert visible_positions(ledger, buffer) == before
    assert dict(buffer.ongoing_txns()) == {TxnId(2, 1): open_txn}
    assert await ledger.trim(now_ms=1 << 62)             # ready: the next attempt goes through
    assert visible_positions(ledger, buffer) == {p for p in before if p.ledger_id in ledger.ledgers}


async def test_pulsar_18833_a_trim_of_entries_already_replayed_lets_the_replay_finish(reopen, monkeypatch):
    """The same race once the replay has read what the trim deletes: the trim goes through
    mid-replay (with a snapshot of what the replay knows, in the same write), the replay ends,
    and a crash right after recovers the same state."""
    env, ledger, buffer, open_txn, before = await reopened_for_a_racing_replay(reopen(), reopen)
    open_ledger = open_txn.ledger_id
    started = trim_when(buffer, lambda verified: verified.ledger_id == open_ledger, monkeypatch)
    await asyncio.wait_for(buffer.recover(), 10)
    assert buffer.state is BufferState.READY
    deleted = await started[0]
    assert deleted and max(deleted) < open_ledger
    assert started[1] is BufferState.INITIALIZING          # the trim landed during the replay
    left = {p for p in before if p.ledger_id in ledger.ledgers}
    assert visible_positions(ledger, buffer) == left
    assert len(buffer.aborted) == 0                        # every abort marker was in a deleted ledger
    env, ledger, buffer = await asyncio.wait_for(crash_and_reopen(env, reopen, ledger, None, SMALL_LEDGERS), 10)
    assert buffer.state is BufferState.READY
    assert visible_positions(ledger, buffer) == left
    assert dict(buffer.ongoing_txns()) == {TxnId(2, 1): open_txn}
    for least in range(0, 8, 2):                          # their markers went with the trim
        with pytest.raises(NotAllowedError):
            await buffer.append(TxnId(1, least), b"late write of an aborted txn")


ABORTED_TXNS = 200_000


async def test_pulsar_pip_178_pip_196_a_snapshot_holds_every_aborted_txn_and_trims_with_ledgers(reopen):
    """PIP-178 (#16042) / PIP-196 (#16913): one snapshot entry could not hold every aborted txn
    id once retention was long, and rewriting it whole on every snapshot amplified the writes,
    so Pulsar split snapshots into segments. Here 200k aborted txns of 4 coordinators across 10
    ledgers go into 20 sealed segments and a small index that recovery uses (no replay), and
    the aborts and their segments leave with the ledgers that held their markers."""
    env = reopen(sync=False)
    ledger = await ManagedLedger.open(env, TOPIC, ManagedLedgerConfig(max_entries_per_ledger=ABORTED_TXNS // 10))
    await ledger.set_property(TXN_PROPERTY, "true")
    cursor = await ledger.open_cursor("sub", "earliest")
    data, marker_type, publish_time = marker_entry(TxnAction.ABORT, TxnId(0, 0))
    # Abort markers alone: what recovery reads of an aborted txn (its entries change nothing).
    writes = [ledger.append_entry(data, txn_most=i % 4, txn_least=i // 4, marker_type=marker_type,
                                  publish_time=publish_time)[1] for i in range(ABORTED_TXNS)]
    positions = await asyncio.gather(*writes)
    buffer = TopicTransactionBuffer(ledger)
    await buffer.recover()
    assert len(buffer.aborted) == ABORTED_TXNS
    await buffer.take_snapshot()
    stored = SnapshotStore(env, ledger.topic_id).load()
    assert len(stored.aborted) == ABORTED_TXNS and stored.max_read_position == ledger.lac
    # One LMDB value has no size limit (Pulsar's snapshot entry had the 5 MB message limit);
    # measured ~19 bytes per abort (its txn id and marker position, and its outcome above the
    # low watermark): a bound that catches an encoding gone wasteful.
    assert len(stored.encode()) < 24 * ABORTED_TXNS
    index, segments = stored_snapshot_records(env, ledger.topic_id)
    assert len(segments) == len(index.segments) == ABORTED_TXNS // DEFAULT_SEGMENT_ABORTS
    assert len(AbortedTxnSet.from_bytes(index.aborted)) == 0       # every abort is before the horizon

    env, ledger, buffer = await crash_and_reopen(env, reopen, ledger)
    assert buffer.stats()["recover_replayed_entries"] == 0
    assert len(buffer.aborted) == ABORTED_TXNS
    assert all(buffer.is_txn_aborted(TxnId(i % 4, i // 4)) for i in range(0, ABORTED_TXNS, 997))

    half = positions[ABORTED_TXNS // 2 - 1]                 # the last entry of the 5th ledger
    cursor = await ledger.open_cursor("sub", "earliest")
    await cursor.ack_cumulative(half)
    ledger.set_retention(0, -1)
    assert len(await ledger.trim(now_ms=1 << 62)) == 5
    assert len(buffer.aborted) == ABORTED_TXNS // 2
    assert not buffer.is_txn_aborted(TxnId(0, 0)) and buffer.is_txn_aborted(TxnId(3, ABORTED_TXNS // 4 - 1))
    assert len(stored_snapshot_records(env, ledger.topic_id)[1]) == ABORTED_TXNS // DEFAULT_SEGMENT_ABORTS // 2
    env, ledger, buffer = await crash_and_reopen(env, reopen, ledger)
    assert len(buffer.aborted) == ABORTED_TXNS // 2 and buffer.stats()["recover_replayed_entries"] == 0
    for i in (0, 1, ABORTED_TXNS // 2 - 1):                 # gone with their markers, still ended here
        with pytest.raises(NotAllowedError):
            await buffer.append(TxnId(i % 4, i // 4), b"late write")
