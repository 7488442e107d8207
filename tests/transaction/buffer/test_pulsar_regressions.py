"""One test per Apache Pulsar transaction-buffer bug this buffer avoids (named by number)."""

import asyncio

import pytest

from core_ext.poskeys import pack_i64, pack_position
from pyengine.errors import NotAllowedError
from pyengine.storage import ManagedLedgerConfig
from pyengine.transaction.buffer import BufferState
from pyengine.transaction.buffer.config import TopicTransactionBufferConfig
from pyengine.transaction.buffer.ended import EndedTxns
from pyengine.transaction.buffer.snapshot import SnapshotStore, TransactionBufferSnapshot
from pyengine.transaction.buffer.topic_buffer import TopicTransactionBuffer
from pyengine_kernels import AbortedTxnSet, Position, TxnId
from tests.transaction.buffer.helpers import open_buffer, shut, visible_positions

SMALL_LEDGERS = ManagedLedgerConfig(max_entries_per_ledger=4)      # nothing trimmed unless a test asks


async def crash_and_reopen(env, reopen, ledger, config=None, ledger_config=None):
    """Restart as after a process crash: no final snapshot, every acknowledged write durable."""
    await ledger.close()
    await env.drain()
    env = reopen(env)
    ledger, buffer = await open_buffer(env, config, ledger_config)
    return env, ledger, buffer


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
    """#12494 / #11318, the other way round: a ledger disappears while recovery reads it."""
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
