"""Unit tests of TopicTransactionBuffer: appends, horizon, commit/abort, low watermarks, errors."""

import asyncio

import pytest

from pyengine.errors import (
    InvalidTxnStatusError,
    NotAllowedError,
    PersistenceError,
    ServiceNotReadyError,
)
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.commands import MARKER_PRODUCER_NAME, parse_message_metadata
from pyengine.storage import ManagedLedger, ManagedLedgerConfig, StorageError
from pyengine.storage.entry import MARKER_TXN_ABORT, MARKER_TXN_COMMIT, split_headers_and_payload
from pyengine.transaction import TxnAction
from pyengine.transaction.buffer import BufferState, TransactionBuffer
from pyengine.transaction.buffer.config import TopicTransactionBufferConfig
from pyengine.transaction.buffer.markers import MARKER_TYPES, marker_entry
from pyengine.transaction.buffer.topic_buffer import TXN_PROPERTY, TopicTransactionBuffer
from pyengine_kernels import Position, TxnId
from tests.transaction.buffer.helpers import TOPIC, fail_next_commit, open_buffer, shut, visible_positions

T1, T2, T3 = TxnId(1, 10), TxnId(1, 11), TxnId(2, 5)


async def test_is_a_transaction_buffer(env):
    ledger, buffer = await open_buffer(env)
    assert isinstance(buffer, TransactionBuffer)
    assert buffer.state is BufferState.READY
    await shut(ledger, buffer)
    assert buffer.state is BufferState.CLOSED


async def test_horizon_follows_plain_appends_when_no_txn_is_open(env):
    ledger, buffer = await open_buffer(env)
    for i in range(5):
        position = await ledger.append(f"p{i}".encode())
        assert buffer.max_read_position() == position == ledger.lac


async def test_txn_entries_are_hidden_until_commit_and_plain_entries_behind_them_wait(env):
    ledger, buffer = await open_buffer(env)
    before = await ledger.append(b"plain before")
    first = await buffer.append(T1, b"t1-a")
    after = await ledger.append(b"plain after")
    second = await buffer.append(T1, b"t1-b")
    assert buffer.max_read_position() == before
    assert visible_positions(ledger, buffer) == {before}
    await buffer.commit(T1, -1)
    assert buffer.max_read_position() == ledger.lac
    assert visible_positions(ledger, buffer) == {before, first, after, second}
    assert buffer.ongoing_txns() == []


async def test_position_is_registered_before_the_entry_is_durable(env):
    """The race Pulsar closes by registering at add time: a plain entry appended right after a
    txn entry must never let the horizon pass the txn entry, even for an instant."""
    ledger, buffer = await open_buffer(env)
    await buffer.append(T2, b"warm up")        # the first txn append ever waits for the property
    await buffer.commit(T2, -1)
    seen = []
    buffer.add_listener(lambda: seen.append((buffer.max_read_position(), ledger.lac)))
    txn_future = buffer.append(T1, b"t")
    assert buffer.ongoing_txns() and buffer.ongoing_txns()[0][0] == T1   # registered at once
    plain_future = ledger.append(b"plain")
    txn_position, plain_position = await txn_future, await plain_future
    assert txn_position < plain_position
    assert seen, "the listener never ran"
    for horizon, _lac in seen:
        assert horizon < txn_position
    assert buffer.max_read_position() < txn_position


async def test_first_txn_append_makes_the_txn_property_durable_first(env):
    ledger, buffer = await open_buffer(env)
    assert TXN_PROPERTY not in ledger.properties
    position = await buffer.append(T1, b"t")
    assert ledger.properties[TXN_PROPERTY] == "true"
    from pyengine.storage.records_pb2 import TopicRecord
    with env.read() as txn:
        record = TopicRecord.FromString(txn.get(TOPIC.encode(), db=env.db("topics")))
    assert record.properties[TXN_PROPERTY] == "true"
    assert ledger.read_entry(position).txn == T1


async def test_appends_keep_their_order_while_the_property_is_written(env):
    ledger, buffer = await open_buffer(env)
    futures = [buffer.append(T1 if i % 2 else T2, f"{i}".encode()) for i in range(6)]
    positions = await asyncio.gather(*futures)
    assert positions == sorted(positions)
    assert [ledger.read_entry(p).data for p in positions] == [f"{i}".encode() for i in range(6)]
    assert dict(buffer.ongoing_txns()) == {T1: positions[1], T2: positions[0]}


async def test_abort_hides_the_txn_for_good_and_markers_are_never_visible(env):
    ledger, buffer = await open_buffer(env)
    plain = await ledger.append(b"plain")
    aborted = await buffer.append(T1, b"x")
    committed = await buffer.append(T2, b"y")
    await buffer.abort(T1, -1)
    assert buffer.is_txn_aborted(T1) and T1 in buffer.aborted
    assert buffer.max_read_position() < committed
    await buffer.commit(T2, -1)
    assert visible_positions(ledger, buffer) == {plain, committed}
    assert aborted not in visible_positions(ledger, buffer)
    markers = [e for e in ledger.read_entries(Position.EARLIEST, 100) if e.is_marker]
    assert [(m.marker_type, m.txn) for m in markers] == [(MARKER_TXN_ABORT, T1), (MARKER_TXN_COMMIT, T2)]
    assert dict(buffer.aborted.items()) == {T1: markers[0].position}


async def test_marker_entries_carry_apache_marker_metadata(env):
    ledger, buffer = await open_buffer(env)
    await buffer.commit(T1, -1)
    (marker,) = ledger.read_entries(Position.EARLIEST, 10)
    metadata, payload = split_headers_and_payload(marker.data)
    meta = parse_message_metadata(metadata)
    assert payload == b""
    assert (meta.marker_type, meta.txnid_most_bits, meta.txnid_least_bits) == (pb.TXN_COMMIT, 1, 10)
    assert meta.producer_name == MARKER_PRODUCER_NAME
    assert (marker.marker_type, marker.txn_most, marker.txn_least) == (MARKER_TXN_COMMIT, 1, 10)


def test_marker_types_are_the_wire_values():
    assert MARKER_TYPES == {TxnAction.COMMIT: pb.TXN_COMMIT, TxnAction.ABORT: pb.TXN_ABORT}
    data, marker_type, publish_time = marker_entry(TxnAction.ABORT, T3, publish_time=123)
    meta = parse_message_metadata(split_headers_and_payload(data)[0])
    assert (marker_type, meta.marker_type, meta.publish_time) == (pb.TXN_ABORT, pb.TXN_ABORT, 123)


@pytest.mark.parametrize("end", ["commit", "abort"])
async def test_append_of_a_txn_that_ended_here_is_refused_with_apaches_answer(env, end):
    ledger, buffer = await open_buffer(env)
    await buffer.append(T1, b"x")
    await getattr(buffer, end)(T1, -1)
    lac = ledger.lac
    with pytest.raises(NotAllowedError, match=r"^Transaction \[\(1,10\)\] has been ended\. "
                                              r"Please use a new transaction to send message\.$"):
        await buffer.append(T1, b"late")
    assert ledger.lac == lac                  # nothing written
    assert buffer.ongoing_txns() == []


async def test_append_at_or_below_the_low_watermark_is_refused(env):
    ledger, buffer = await open_buffer(env)
    await buffer.commit(TxnId(1, 20), 15)
    assert buffer.low_watermark(1) == 15
    for least in (0, 15):
        with pytest.raises(NotAllowedError):
            await buffer.append(TxnId(1, least), b"x")
    await buffer.append(TxnId(1, 16), b"ok")             # above the watermark
    await buffer.append(TxnId(2, 3), b"ok")              # another coordinator
    assert {t for t, _ in buffer.ongoing_txns()} == {TxnId(1, 16), TxnId(2, 3)}


async def test_append_while_the_end_is_in_flight_is_refused(env):
    ledger, buffer = await open_buffer(env)
    await buffer.append(T1, b"x")
    commit = asyncio.ensure_future(buffer.commit(T1, -1))
    await asyncio.sleep(0)                 # the marker is appended, not yet durable
    with pytest.raises(NotAllowedError):
        await buffer.append(T1, b"after the marker")
    await commit
    assert [e.marker_type for e in ledger.read_entries(Position.EARLIEST, 10)] == [0, MARKER_TXN_COMMIT]


async def test_commit_and_abort_are_idempotent(env):
    ledger, buffer = await open_buffer(env)
    await buffer.append(T1, b"x")
    await buffer.append(T2, b"y")
    await buffer.commit(T1, -1)
    await buffer.abort(T2, -1)
    entries = len(ledger.read_entries(Position.EARLIEST, 100))
    await buffer.commit(T1, -1)
    await buffer.abort(T2, -1)
    assert len(ledger.read_entries(Position.EARLIEST, 100)) == entries   # known outcome: no new marker
    assert buffer.stats()["committed_total"] == 1 and buffer.stats()["aborted_total"] == 1


async def test_concurrent_ends_of_one_txn_write_one_marker(env):
    ledger, buffer = await open_buffer(env)
    await buffer.append(T1, b"x")
    await asyncio.gather(buffer.commit(T1, -1), buffer.commit(T1, -1), buffer.commit(T1, -1))
    markers = [e for e in ledger.read_entries(Position.EARLIEST, 100) if e.is_marker]
    assert len(markers) == 1


async def test_a_cancelled_end_does_not_fail_the_ends_waiting_on_the_same_marker(env):
    ledger, buffer = await open_buffer(env)
    await buffer.append(T1, b"x")
    first = asyncio.ensure_future(buffer.commit(T1, -1))
    await asyncio.sleep(0)                               # its marker is being written
    repeat = asyncio.ensure_future(buffer.commit(T1, -1))
    await asyncio.sleep(0)
    first.cancel()
    await repeat                                         # the marker landed: the repeat succeeds
    assert first.cancelled()
    assert [e.marker_type for e in ledger.read_entries(Position.EARLIEST, 10)] == [0, MARKER_TXN_COMMIT]
    assert buffer.max_read_position() == ledger.lac


@pytest.mark.parametrize("first, then", [("commit", "abort"), ("abort", "commit")])
async def test_the_opposite_end_of_an_ended_txn_is_an_error(env, first, then):
    ledger, buffer = await open_buffer(env)
    await buffer.append(T1, b"x")
    await getattr(buffer, first)(T1, -1)
    with pytest.raises(InvalidTxnStatusError):
        await getattr(buffer, then)(T1, -1)
    # ... also while the first end is still in flight
    await buffer.append(T2, b"y")
    pending = asyncio.ensure_future(getattr(buffer, first)(T2, -1))
    await asyncio.sleep(0)
    with pytest.raises(InvalidTxnStatusError):
        await getattr(buffer, then)(T2, -1)
    await pending


async def test_end_of_a_txn_that_never_wrote_here_writes_the_marker(env):
    ledger, buffer = await open_buffer(env)
    await buffer.abort(T3, -1)
    (marker,) = ledger.read_entries(Position.EARLIEST, 10)
    assert marker.marker_type == MARKER_TXN_ABORT and marker.txn == T3
    assert buffer.is_txn_aborted(T3)
    with pytest.raises(NotAllowedError):
        await buffer.append(T3, b"late")


async def test_end_of_a_forgotten_txn_below_the_low_watermark_changes_nothing(env):
    ledger, buffer = await open_buffer(env)
    await buffer.commit(TxnId(1, 50), 40)
    entries = len(ledger.read_entries(Position.EARLIEST, 100))
    await buffer.abort(TxnId(1, 7), 40)          # ended long ago, outcome no longer known here
    await buffer.commit(TxnId(1, 8), 40)
    assert len(ledger.read_entries(Position.EARLIEST, 100)) == entries
    assert not buffer.is_txn_aborted(TxnId(1, 7))


async def test_low_watermark_never_moves_back(env):
    ledger, buffer = await open_buffer(env)
    await buffer.commit(TxnId(1, 30), 20)
    await buffer.commit(TxnId(1, 31), 5)
    assert buffer.low_watermark(1) == 20
    assert buffer.stats()["low_watermarks"] == {1: 20}


async def test_low_watermark_aborts_every_open_txn_of_that_coordinator_below_it(env):
    ledger, buffer = await open_buffer(env)
    plain = await ledger.append(b"plain")
    a = await buffer.append(TxnId(1, 3), b"a")
    b = await buffer.append(TxnId(1, 4), b"b")
    c = await buffer.append(TxnId(1, 9), b"c")        # above the watermark: stays open
    d = await buffer.append(TxnId(2, 1), b"d")        # other coordinator: stays open
    await buffer.commit(TxnId(1, 8), 5)
    assert buffer.is_txn_aborted(TxnId(1, 3)) and buffer.is_txn_aborted(TxnId(1, 4))
    assert {t for t, _ in buffer.ongoing_txns()} == {TxnId(1, 9), TxnId(2, 1)}
    assert buffer.max_read_position() == ledger.previous_position(c)
    await buffer.commit(TxnId(1, 9), 8)
    await buffer.commit(TxnId(2, 1), -1)
    assert visible_positions(ledger, buffer) == {plain, c, d}
    assert a not in visible_positions(ledger, buffer) and b not in visible_positions(ledger, buffer)


async def test_a_failed_abort_by_low_watermark_is_tried_again_by_the_next_end(env):
    """The marker of an abort the buffer decided itself (a low watermark above an open txn)
    fails: the txn stays open, and the next end from its coordinator aborts it again. Kept out
    of the watermark's bookkeeping instead, it held the read horizon before its entry for good,
    hiding everything after it from READ_COMMITTED readers."""
    ledger, buffer = await open_buffer(env)
    stuck = await buffer.append(TxnId(1, 3), b"late write, its end request was lost")
    await buffer.append(TxnId(1, 7), b"y")
    await buffer.commit(TxnId(1, 7), 0)
    fail_next_commit(env)                      # the abort's marker
    await buffer.commit(TxnId(1, 7), 6)        # a repeat carrying watermark 6: T(1,3) is aborted
    assert not buffer.is_txn_aborted(TxnId(1, 3))
    assert buffer.max_read_position() == ledger.previous_position(stuck)
    await buffer.append(TxnId(1, 9), b"z")
    await buffer.commit(TxnId(1, 9), 8)
    later = await ledger.append(b"plain, after everything")
    assert buffer.is_txn_aborted(TxnId(1, 3))
    assert later in visible_positions(ledger, buffer) and stuck not in visible_positions(ledger, buffer)


async def test_the_commit_of_a_txn_aborted_by_low_watermark_is_an_error(env):
    """The buffer aborted the txn itself; a commit coming later (a coordinator that decided
    otherwise) must not be answered as applied: its messages stay hidden."""
    ledger, buffer = await open_buffer(env)
    stuck = await buffer.append(TxnId(1, 3), b"late write")
    await buffer.append(TxnId(1, 7), b"y")
    await buffer.commit(TxnId(1, 7), 6)
    assert buffer.is_txn_aborted(TxnId(1, 3))
    with pytest.raises(InvalidTxnStatusError):
        await buffer.commit(TxnId(1, 3), 6)
    assert stuck not in visible_positions(ledger, buffer)
    await buffer.abort(TxnId(1, 3), 6)         # the same decision again: fine


async def test_failed_append_unregisters_a_txn_whose_only_position_it_was(env):
    ledger, buffer = await open_buffer(env)
    await buffer.append(T2, b"warm up")               # the txn property is durable now
    fail_next_commit(env)
    with pytest.raises(StorageError):
        await buffer.append(T1, b"lost")
    assert T1 not in dict(buffer.ongoing_txns())
    assert T2 in dict(buffer.ongoing_txns())
    await buffer.commit(T2, -1)
    assert buffer.max_read_position() == ledger.lac
    position = await buffer.append(T1, b"again")       # the txn did not end: it may write again
    assert dict(buffer.ongoing_txns()) == {T1: position}


async def test_failed_append_keeps_the_txn_open_from_its_earlier_durable_entry(env):
    ledger, buffer = await open_buffer(env)
    first = await buffer.append(T1, b"kept")
    fail_next_commit(env)
    with pytest.raises(StorageError):
        await buffer.append(T1, b"lost")
    assert dict(buffer.ongoing_txns()) == {T1: first}


async def test_failed_marker_leaves_the_txn_open_and_a_retry_ends_it(env):
    ledger, buffer = await open_buffer(env)
    position = await buffer.append(T1, b"x")
    fail_next_commit(env)
    with pytest.raises(PersistenceError):
        await buffer.commit(T1, -1)
    assert dict(buffer.ongoing_txns()) == {T1: position}
    assert buffer.max_read_position() < position
    await buffer.commit(T1, -1)
    assert position in visible_positions(ledger, buffer)


async def test_aborted_set_is_trimmed_with_the_ledgers(env):
    config = ManagedLedgerConfig(max_entries_per_ledger=2, retention_ms=0)
    ledger, buffer = await open_buffer(env, ledger_config=config)
    cursor = await ledger.open_cursor("sub", "earliest")
    for least in range(4):
        await buffer.append(TxnId(1, least), b"x")
        await buffer.abort(TxnId(1, least), least - 1)
    kept = TxnId(1, 3)
    marker_of_kept = dict(buffer.aborted.items())[kept]
    await ledger.append(b"roll")
    first = ledger.first_position()
    await cursor.ack_cumulative(ledger.previous_position(marker_of_kept))
    await ledger.trim(now_ms=1 << 62)          # (the ack may have started trimming already)
    assert first < ledger.first_position() <= marker_of_kept
    assert [t for t, _ in buffer.aborted.items()] == [kept]
    assert buffer.stats()["aborted_txn_count"] == 1


async def test_horizon_names_the_entry_before_a_txn_that_starts_a_ledger(env):
    ledger, buffer = await open_buffer(env, ledger_config=ManagedLedgerConfig(max_entries_per_ledger=2))
    await ledger.append(b"a")
    last_of_first_ledger = await ledger.append(b"b")
    position = await buffer.append(T1, b"t")
    assert position == Position(last_of_first_ledger.ledger_id + 1, 0)
    assert buffer.max_read_position() == last_of_first_ledger


async def test_listeners_hear_of_ends_and_lac_moves(env):
    ledger, buffer = await open_buffer(env)
    calls = []
    buffer.add_listener(lambda: calls.append(buffer.max_read_position()))
    await ledger.append(b"plain")
    assert calls
    await buffer.append(T1, b"x")
    calls.clear()
    await buffer.commit(T1, -1)
    assert calls[-1] == ledger.lac


async def test_a_failing_listener_does_not_break_the_buffer(env):
    ledger, buffer = await open_buffer(env)

    def broken() -> None:
        raise RuntimeError("listener bug")

    buffer.add_listener(broken)
    await buffer.append(T1, b"x")
    await buffer.commit(T1, -1)
    assert buffer.max_read_position() == ledger.lac


async def test_stats(env):
    ledger, buffer = await open_buffer(env)
    await buffer.append(T1, b"x")
    await buffer.append(T2, b"y")
    await buffer.abort(T2, 3)
    stats = buffer.stats()
    assert stats["state"] == "ready"
    assert stats["ongoing_txn_count"] == 1
    assert stats["aborted_txn_count"] == 1
    assert stats["max_read_position"] == str(buffer.max_read_position())
    assert stats["low_watermarks"] == {1: 3}
    assert stats["last_snapshot_position"] is not None          # the first snapshot
    assert stats["last_snapshot_timestamp"] > 0
    assert stats["recover_end_time"] >= stats["recover_start_time"] > 0


async def test_close_refuses_new_work(env):
    ledger, buffer = await open_buffer(env)
    await buffer.append(T1, b"x")
    await buffer.close()
    await buffer.close()                         # idempotent
    with pytest.raises(ServiceNotReadyError):
        await buffer.append(T1, b"y")
    with pytest.raises(ServiceNotReadyError):
        await buffer.commit(T1, -1)
    with pytest.raises(ServiceNotReadyError):
        await buffer.recover()


async def test_commit_before_recover_is_not_ready(env):
    ledger = await ManagedLedger.open(env, TOPIC)
    buffer = TopicTransactionBuffer(ledger)
    assert buffer.state is BufferState.NONE
    assert buffer.max_read_position() == Position.EARLIEST
    with pytest.raises(ServiceNotReadyError):
        await buffer.commit(T1, -1)


async def test_appends_made_before_recovery_wait_for_it(env):
    ledger = await ManagedLedger.open(env, TOPIC)
    buffer = TopicTransactionBuffer(ledger)
    future = buffer.append(T1, b"early")
    await asyncio.sleep(0.01)
    assert not future.done() and ledger.lac.entry_id == -1
    await buffer.recover()
    position = await future
    assert dict(buffer.ongoing_txns()) == {T1: position}


async def test_cancelled_append_still_registers_its_entry(env):
    """A caller giving up on an append does not make the entry disappear: it stays the txn's."""
    ledger, buffer = await open_buffer(env)
    await buffer.append(T2, b"warm up")
    future = buffer.append(T1, b"x")
    future.cancel()
    await env.barrier()
    await asyncio.sleep(0)
    await buffer.commit(T2, -1)
    (first_of_t1,) = [p for t, p in buffer.ongoing_txns() if t == T1]
    assert ledger.read_entry(first_of_t1).data == b"x"
    assert buffer.max_read_position() < first_of_t1


@pytest.mark.parametrize("call, error", [
    (lambda b: b.append((1, 2), b"x"), TypeError),
    (lambda b: b.append(T1, "text"), TypeError),
    (lambda b: b.append(T1, b"x", num_messages=0), ValueError),
    (lambda b: b.append(T1, b"x", num_messages=True), TypeError),
    (lambda b: b.append(T1, b"x", publish_time=-1), ValueError),
    (lambda b: b.is_txn_aborted("1:2"), TypeError),
    (lambda b: b.add_listener(42), TypeError),
])
async def test_malformed_input_is_refused_clearly(env, call, error):
    ledger, buffer = await open_buffer(env)
    with pytest.raises(error):
        call(buffer)


@pytest.mark.parametrize("txn, watermark, error", [
    ("T1", 0, TypeError), (T1, "0", TypeError), (T1, -2, ValueError), (T1, 1.5, TypeError),
])
async def test_malformed_end_requests_are_refused(env, txn, watermark, error):
    ledger, buffer = await open_buffer(env)
    with pytest.raises(error):
        await buffer.commit(txn, watermark)


def test_constructor_checks_its_arguments():
    with pytest.raises(TypeError):
        TopicTransactionBuffer("not a ledger")      # type: ignore[arg-type]
    with pytest.raises(ValueError):
        TopicTransactionBufferConfig(snapshot_max_txn_count=0)
    with pytest.raises(ValueError):
        TopicTransactionBufferConfig(replay_chunk_entries=-5)


async def test_horizon_never_passes_the_lac(env):
    """A plain entry appended just before a txn entry is not durable yet: the horizon (the
    position before the txn's first entry) must not expose it before the LAC does."""
    ledger, buffer = await open_buffer(env)
    await buffer.append(T2, b"warm up")
    await buffer.commit(T2, -1)
    lac = ledger.lac
    plain_position, plain_durable = ledger.append_entry(b"plain, in flight")
    txn_future = buffer.append(T1, b"txn, in flight")
    assert buffer.max_read_position() == lac < plain_position
    await plain_durable
    await txn_future
    assert buffer.max_read_position() == plain_position


# --- end_now: the coordinator's end without a coroutine -------------------------------------

async def test_end_now_queues_the_marker_before_it_returns_and_ends_the_txn_as_commit_does(env):
    ledger, buffer = await open_buffer(env)
    position = await buffer.append(T1, b"x")
    lac = ledger.lac
    ended = buffer.end_now(T1, TxnAction.COMMIT, -1)
    assert ended is not None and not ended.done()
    with pytest.raises(NotAllowedError, match="has been ended"):   # ending: late writes refused at once
        await buffer.append(T1, b"late")
    assert await ended is None
    marker = ledger.read_entries(ledger.next_position(lac), 1)[0]
    assert marker.marker_type == MARKER_TXN_COMMIT
    assert buffer.ongoing_txns() == [] and position in visible_positions(ledger, buffer)
    assert buffer.stats()["committed_total"] == 1
    # Ended, ending, or unknown to a buffer that cannot take a marker at once: None, and the
    # coroutine (which knows every such case) answers.
    assert buffer.end_now(T1, TxnAction.COMMIT, -1) is None
    assert buffer.end_now(T1, TxnAction.ABORT, -1) is None
    with pytest.raises(InvalidTxnStatusError):
        await buffer.abort(T1, -1)


async def test_end_now_writes_its_marker_with_the_decision_and_fails_without_it(env):
    """`after`: the marker is durable only with the coordinator's decision; if that write
    fails, so does the marker, and the txn stays open for the retry."""
    ledger, buffer = await open_buffer(env)
    position = await buffer.append(T1, b"x")
    decision = env.submit(lambda txn: None)
    ended = buffer.end_now(T1, TxnAction.ABORT, -1, after=decision)
    await decision
    await ended
    assert buffer.is_txn_aborted(T1)
    await buffer.append(T2, b"y")
    fail_next_commit(env)
    failed_decision = env.submit(lambda txn: None)
    ended = buffer.end_now(T2, TxnAction.COMMIT, -1, after=failed_decision)
    with pytest.raises(PersistenceError):
        await ended
    assert T2 in dict(buffer.ongoing_txns())
    again = buffer.end_now(T2, TxnAction.COMMIT, -1)                # not ending any more: again
    assert again is not None
    await again
    assert buffer.ongoing_txns() == [] and position not in visible_positions(ledger, buffer)


async def test_end_now_applies_the_low_watermark_and_waits_for_the_aborts_it_starts(env):
    ledger, buffer = await open_buffer(env)
    stale = await buffer.append(TxnId(1, 3), b"stale")
    await buffer.append(TxnId(1, 9), b"current")
    ended = buffer.end_now(TxnId(1, 9), TxnAction.COMMIT, 5)
    await ended
    assert buffer.is_txn_aborted(TxnId(1, 3)) and buffer.ongoing_txns() == []
    assert stale not in visible_positions(ledger, buffer)
    assert buffer.low_watermark(1) == 5


async def test_end_now_leaves_what_it_cannot_do_at_once_to_the_coroutine(env):
    ledger, buffer = await open_buffer(env)
    assert buffer.end_now(T1, TxnAction.COMMIT, -1) is None          # no txn entry yet: property unwritten
    await buffer.commit(T1, -1)
    await buffer.append(T2, b"x")
    await buffer.commit(TxnId(2, 9), 7)
    assert buffer.end_now(TxnId(2, 6), TxnAction.ABORT, 7) is None   # forgotten below the watermark
    await ledger.terminate()
    assert buffer.end_now(T2, TxnAction.COMMIT, -1) is None          # a terminated ledger takes no marker
    await buffer.commit(T2, -1)
    await shut(ledger, buffer)
    assert buffer.end_now(T3, TxnAction.COMMIT, -1) is None          # closed


async def test_a_cancelled_end_now_caller_cancels_nothing_else(env):
    ledger, buffer = await open_buffer(env)
    await buffer.append(T1, b"x")
    ended = buffer.end_now(T1, TxnAction.COMMIT, -1)
    waiting = asyncio.ensure_future(buffer.commit(T1, -1))          # a repeat, on the same marker
    await asyncio.sleep(0)
    ended.cancel()
    await waiting
    assert buffer.ongoing_txns() == [] and buffer.stats()["committed_total"] == 1


@pytest.mark.parametrize("txn, watermark, after, error", [
    ("T1", 0, None, TypeError), (T1, "0", None, TypeError), (T1, -2, None, ValueError),
    (T1, 0, "decision", TypeError),
])
async def test_malformed_end_now_requests_are_refused(env, txn, watermark, after, error):
    ledger, buffer = await open_buffer(env)
    with pytest.raises(error):
        buffer.end_now(txn, TxnAction.COMMIT, watermark, after=after)
