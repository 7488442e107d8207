"""Each open of a managed ledger starts a ledger; one closed without an entry is deleted at the
next open, as Pulsar's ManagedLedgerImpl deletes the ledgers with no entries when it opens a
managed ledger. Found by an audit: with the default retention (everything kept) a topic loaded
and unloaded N times kept N empty ledgers for good (3,002 ledgers for 3 entries after 3,000
loads), each in every scan of the ledger list.

Kept: the ledger of a terminated position (the LAC after a restart must be that position) and
the first ledger of a topic nothing was ever trimmed from (where its ledger ids begin tells a
stream's failOnDataLoss a topic deleted and created again from this one). Positions in a ledger
that went (a cursor's mark-delete at (L, -1)) keep their meaning."""

import pytest

from pyengine.storage import ManagedLedger, ManagedLedgerConfig, TopicTerminatedError
from pyengine.storage.reader import StoreReader
from pyengine_kernels import Position

TOPIC = "persistent://public/default/reloaded"


async def test_a_topic_reopened_many_times_keeps_no_empty_ledger_but_its_current_one(env):
    ml = await ManagedLedger.open(env, TOPIC)
    positions = [await ml.append(b"m%d" % i) for i in range(3)]
    await ml.close()
    for _ in range(30):
        ml = await ManagedLedger.open(env, TOPIC)
        await ml.close()
    ml = await ManagedLedger.open(env, TOPIC)
    assert [info.ledger_id for info in ml.ledgers.values()] == [positions[0].ledger_id, ml._current.ledger_id]
    assert ml.lac == positions[-1]
    assert [e.position for e in ml.read_entries(Position(-1, -1), 10)] == positions
    assert ml.number_of_entries == 3
    appended = await ml.append(b"m3")
    assert ml.next_position(positions[-1]) == appended
    await ml.close()


async def test_a_topic_never_written_keeps_its_first_ledger(env, reopen):
    ml = await ManagedLedger.open(env, TOPIC)
    first = ml._current.ledger_id
    await ml.close()
    for _ in range(5):
        env = reopen(env)
        ml = await ManagedLedger.open(env, TOPIC)
        await ml.close()
    env = reopen(env)
    ml = await ManagedLedger.open(env, TOPIC)
    assert list(ml.ledgers) == [first, ml._current.ledger_id]
    await ml.close()
    env.close()
    with StoreReader(env.path) as reader:
        assert reader.topic(TOPIC).ledgers[0].ledger_id == first


async def test_a_cursor_in_a_ledger_that_went_reads_on_from_the_next_entry(env, reopen):
    """A cursor created at the LAC of a topic whose entries were all trimmed stands at
    (empty ledger, -1); that ledger goes at the next open."""
    config = ManagedLedgerConfig(max_entries_per_ledger=3, retention_ms=0)
    ml = await ManagedLedger.open(env, TOPIC, config)
    for i in range(3):
        await ml.append(b"old%d" % i)
    await ml.close()
    ml = await ManagedLedger.open(reopen(env), TOPIC, config)
    await ml.trim(10**15)                                  # everything was consumed (no cursor)
    await ml.close()
    ml = await ManagedLedger.open(reopen(ml.env), TOPIC, config)
    cursor = await ml.open_cursor("sub", "latest")
    mark_delete = cursor.mark_delete
    assert mark_delete.entry_id == -1
    await ml.close()

    ml = await ManagedLedger.open(reopen(ml.env), TOPIC, ManagedLedgerConfig(max_entries_per_ledger=3))
    assert mark_delete.ledger_id not in ml.ledgers          # it went
    cursor = await ml.open_cursor("sub", "earliest")
    assert cursor.mark_delete == mark_delete
    assert cursor.backlog() == 0
    appended = [await ml.append(b"new%d" % i) for i in range(4)]
    assert cursor.backlog() == 4
    assert [e.position for e in ml.read_entries(cursor.read_position, 10)] == appended
    await cursor.ack_cumulative(appended[-1])
    assert cursor.backlog() == 0
    await ml.close()


@pytest.mark.parametrize("entries", [0, 2])
async def test_a_terminated_topic_keeps_the_ledger_of_its_last_position(env, reopen, entries):
    ml = await ManagedLedger.open(env, TOPIC)
    for i in range(entries):
        await ml.append(b"m%d" % i)
    await ml.close()
    ml = await ManagedLedger.open(reopen(env), TOPIC)       # (an empty ledger after the first)
    last = await ml.terminate()
    await ml.close()
    for _ in range(3):
        ml = await ManagedLedger.open(reopen(ml.env), TOPIC)
        assert ml.terminated_at == last and ml.lac == last
        assert last.ledger_id in ml.ledgers
        with pytest.raises(TopicTerminatedError):
            await ml.append(b"late")
        await ml.close()
