"""Storage on LMDB, findings of a review: each test failed before its fix."""

import asyncio
import threading

import pytest

from pyengine.storage import CorruptRecordError, ManagedLedger, ManagedLedgerConfig, StorageError
from pyengine_kernels import Position
from tests.storage.helpers import fail_next_save, settled

TOPIC = "persistent://public/default/t"


async def test_an_ack_after_the_last_entry_is_refused_and_later_entries_stay_unacknowledged(env):
    """The cursor took an acknowledgement of a position after the LAC (cumulative, individual,
    or of batch indexes): it then counted the entry later written there as acknowledged, and a
    cumulative one every entry up to it, so they were never delivered (and trims could delete
    them). Pulsar's ManagedCursor refuses it ("Invalid mark deleted position")."""
    ml = await ManagedLedger.open(env, TOPIC, ManagedLedgerConfig(max_entries_per_ledger=2))
    first = await ml.append(b"m")
    cursor = await ml.open_cursor("s", "earliest")
    ahead = Position(first.ledger_id, first.entry_id + 1)       # where the next entry goes
    with pytest.raises(ValueError, match="after the last entry"):
        cursor.ack_cumulative(ahead)
    with pytest.raises(ValueError, match="after the last entry"):
        cursor.ack([first, ahead])
    with pytest.raises(ValueError, match="after the last entry"):
        cursor.ack_batch_indexes(ahead, [0b10], 2)
    with pytest.raises(ValueError, match="after the last entry"):
        cursor.ack_cumulative(Position(1 << 40, 0))
    assert cursor.mark_delete == first.prev() and not cursor.is_acked(first)
    assert cursor.batch_ack_set(ahead) is None
    later = [await ml.append(b"m") for _ in range(3)]
    assert later[0] == ahead
    assert cursor.backlog() == 4 and not any(cursor.is_acked(p) for p in later)
    await cursor.ack_cumulative(later[-1])           # up to the LAC: taken
    assert cursor.backlog() == 0


def holding(started: threading.Event, release: threading.Event):
    """A write that holds the writer thread (its group commit in flight) until `release`."""
    def write(txn):
        started.set()
        release.wait(10)
    return write


@pytest.mark.parametrize("what", ["topic", "empty topic", "cursor"])
async def test_a_name_lmdb_cannot_key_is_refused_before_it_fails_the_appends_sharing_its_commit(env, what):
    """A topic name LMDB cannot take as a key (over 511 bytes, or empty), or a cursor name
    that makes its record's key too long, was found out by the group commit: MDB_BAD_VALSIZE
    failed the whole batch, and with it the appends of other topics that shared it. It is
    refused at once (ValueError), and nothing else is written or failed."""
    ml = await ManagedLedger.open(env, TOPIC)
    started, release = threading.Event(), threading.Event()
    env.submit(holding(started, release))           # the next batch gathers behind it
    await asyncio.to_thread(started.wait, 10)
    appended = ml.append(b"m")
    if what == "cursor":
        opening = asyncio.ensure_future(ml.open_cursor("s" * 510, "earliest"))
    else:
        opening = asyncio.ensure_future(ManagedLedger.open(env, "t" * 600 if what == "topic" else ""))
    for _ in range(5):
        await asyncio.sleep(0)                      # (its write, if any, is queued by now)
    release.set()
    with pytest.raises(ValueError, match="LMDB key"):
        await opening
    assert await appended == Position(ml.lac.ledger_id, 0)
    assert list(ml.cursors) == []


@pytest.mark.parametrize("key, value", [("k", 1), (2, "v"), (b"k", "v"), ("k", b"v")])
async def test_a_property_that_is_not_a_string_is_refused_and_not_kept_in_memory(env, reopen, key, value):
    """set_property took a key or value that is not a str into `properties` before the record
    refused it (TypeError): the topic then reported, for as long as it was loaded, a property
    that was never stored."""
    ml = await ManagedLedger.open(env, TOPIC)
    await ml.set_property("kept", "1")
    with pytest.raises(TypeError, match="must be str"):
        await ml.set_property(key, value)
    assert ml.properties == {"kept": "1"}
    await ml.set_property("other", "2")             # the record's later saves go on as before
    await ml.close()
    ml = await ManagedLedger.open(reopen(env), TOPIC)
    assert ml.properties == {"kept": "1", "other": "2"}


async def test_a_topic_record_that_cannot_be_decoded_is_a_corrupt_record_error(env):
    """Opening a managed ledger whose topic record is damaged raised protobuf's DecodeError,
    no StorageError at all, where its ledger and cursor records (and the StoreReader's read of
    the same record) raise CorruptRecordError."""
    key = TOPIC.encode()
    env.write_now(lambda txn: txn.put(key, b"\xff\xff\xff", db=env.db("topics")))
    with pytest.raises(CorruptRecordError, match="topic record"):
        await ManagedLedger.open(env, TOPIC)


@pytest.mark.parametrize("ahead", [3, 1 << 20])
async def test_a_seek_past_the_next_entry_to_be_written_goes_to_it(env, ahead):
    """A cursor reset to a position after the next one to be written (the embedding API's
    consumer.seek to a message id not written yet) left the mark-delete position after the
    LAC: the entries then written up to it counted as acknowledged and were never delivered.
    The seek goes to the next entry to be written, as the protocol's and the admin API's do."""
    ml = await ManagedLedger.open(env, TOPIC)
    first = await ml.append(b"m")
    cursor = await ml.open_cursor("s", "earliest")
    await cursor.seek(Position(first.ledger_id, first.entry_id + ahead), ack_set=[0b10])
    assert cursor.mark_delete == first and cursor.batch_ack_set(first.next()) is None
    later = [await ml.append(b"m") for _ in range(4)]
    assert cursor.read_position == later[0]
    assert cursor.backlog() == 4 and not any(cursor.is_acked(p) for p in later)
    assert [e.position for e in ml.read_entries(cursor.read_position, 10)] == later


async def test_a_trim_of_an_empty_ledger_after_unconsumed_ones_deletes_none_of_their_entries(env, reopen):
    """A trim deletes every empty closed ledger, also one after ledgers a cursor has not
    consumed (a ledger closed empty by a failed append). The position before which the trim
    took every entry as deleted was the one after the last ledger it deleted: that empty
    ledger's, past the unconsumed ledgers. Reads then skipped their entries, and the removal of
    deleted entries removed them from LMDB: never delivered, lost for good."""
    config = ManagedLedgerConfig(max_entries_per_ledger=2, retention_ms=0, retention_bytes=0)
    ml = await ManagedLedger.open(env, TOPIC, config)
    cursor = await ml.open_cursor("s", "earliest")
    consumed = [await ml.append(b"m") for _ in range(2)]        # the first ledger, filled
    kept = [await ml.append(b"m") for _ in range(2)]            # the second, filled
    fail_next_save(env, "append")
    with pytest.raises(StorageError):
        await ml.append(b"lost")                                # a third, closed empty
    empty = max(ml.ledgers)
    assert ml.ledgers[empty].closed and ml.ledgers[empty].entries == 0
    await cursor.ack_cumulative(consumed[-1])
    await settled(ml)
    await ml.trim()                                             # (waits for the removal too)
    assert consumed[0].ledger_id not in ml.ledgers and empty not in ml.ledgers
    assert [e.position for e in ml.read_entries(cursor.read_position, 10)] == kept
    assert cursor.backlog() == 2 and ml.number_of_entries == 2
    await ml.close()
    ml = await ManagedLedger.open(reopen(env), TOPIC, config)
    cursor = await ml.open_cursor("s")
    assert [e.position for e in ml.read_entries(cursor.read_position, 10)] == kept
    assert cursor.backlog() == 2


async def test_the_backlog_counts_no_ack_of_a_position_that_holds_no_entry(env):
    """The backlog took off every individual ack after the mark-delete position, also those of
    positions no entry is at (past a closed ledger's last entry, in a ledger id the topic does
    not have or no longer has: a client's stale or malformed message id, taken as it is before
    the LAC), so it fell short of what is left, down to negative numbers. Pulsar counts the
    acknowledged entries of the range, those that exist."""
    ml = await ManagedLedger.open(env, TOPIC, ManagedLedgerConfig(max_entries_per_ledger=2))
    other = await ManagedLedger.open(env, "persistent://public/default/other")
    positions = [await ml.append(b"m") for _ in range(2)]      # a full ledger
    await other.append(b"m")                                    # (takes the next ledger id)
    positions.append(await ml.append(b"m"))                     # one entry in the next
    assert positions[2].ledger_id == positions[0].ledger_id + 2
    cursor = await ml.open_cursor("s", "earliest")
    nowhere = [Position(positions[0].ledger_id, entry) for entry in (2, 3, 4, 5, 7)]
    await cursor.ack([*nowhere, Position(positions[0].ledger_id + 1, 0)])      # (the other topic's ledger)
    assert cursor.backlog() == 3
    await cursor.ack([positions[1]])
    assert cursor.backlog() == 2


@pytest.mark.parametrize("ack_set", [["a"], [1 << 64], "ab", 5])
async def test_a_seek_with_a_malformed_ack_set_leaves_the_cursor_as_it_was(env, ack_set):
    """A seek whose ack set is not a list of int64 words raised only after the cursor had moved
    in memory and dropped its individual acks, none of it saved: the cursor then said it was
    where no seek took it, and the next save made that durable."""
    ml = await ManagedLedger.open(env, TOPIC)
    positions = [await ml.append(b"m") for _ in range(4)]
    cursor = await ml.open_cursor("s", "earliest")
    await cursor.ack([positions[2]])
    before = (cursor.mark_delete, cursor.read_position, cursor.individually_deleted_ranges())
    with pytest.raises((TypeError, ValueError)):
        cursor.seek(positions[1], ack_set=ack_set)
    assert (cursor.mark_delete, cursor.read_position, cursor.individually_deleted_ranges()) == before
    assert cursor.backlog() == 3


async def test_individual_acks_that_move_the_mark_delete_past_the_read_position_move_it_too(env):
    """Individual acks of entries not read yet (a consumer's acks of messages it got before a
    reconnect) moved the mark-delete position past the read position, which stayed behind it:
    reads from the read position got acknowledged entries again, and the subscription's stats
    showed a read position before its mark-delete position. Pulsar moves the read position on
    with the mark-delete position, as a cumulative ack did here already."""
    ml = await ManagedLedger.open(env, TOPIC, ManagedLedgerConfig(max_entries_per_ledger=2))
    positions = [await ml.append(b"m") for _ in range(4)]
    cursor = await ml.open_cursor("s", "earliest")
    assert cursor.read_position == positions[0]
    await cursor.ack([positions[1], positions[2], positions[0]])
    assert cursor.mark_delete == positions[2]
    assert cursor.read_position == positions[3]
    assert [e.position for e in ml.read_entries(cursor.read_position, 10)] == [positions[3]]
