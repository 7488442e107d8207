"""The v4 pending-ack log: keys per subscription, order, chunked scans, deletion."""

import pytest

from pyengine.storage import ManagedLedger
from pyengine.transaction.pendingack import IndividualAck, PendingAckReplayError
from pyengine.transaction.pendingack.log_store import LogPendingAckStore
from pyengine_kernels import Position, TxnId
from tests.transaction.pendingack.helpers import T1, T2, acking


def all_records(store, chunk_size=1000):
    return [logged for chunk in store.scan(chunk_size) for logged in chunk]


async def stores(env, *names, topic="persistent://public/default/log"):
    ledger = await ManagedLedger.open(env, topic)
    return [LogPendingAckStore.for_cursor(await ledger.open_cursor(name)) for name in names]


async def test_records_come_back_in_order_with_their_content(env):
    (store,) = await stores(env, "s")
    acks = [IndividualAck(Position(3, 4)), IndividualAck(Position(3, 5), 70, tuple(acking(70, 1, 66)))]
    seq_a, written_a = store.append_individual(T1, acks)
    seq_b, written_b = store.append_cumulative(T2, Position(3, 9))
    await written_a
    await written_b
    assert (seq_a, seq_b) == (0, 1)
    first, second = all_records(store)
    assert (first.seq, first.txn, first.individual, first.cumulative) == (0, T1, tuple(acks), None)
    assert (second.seq, second.txn, second.individual, second.cumulative) == (1, T2, (), Position(3, 9))


async def test_prefixes_keep_subscriptions_and_topics_apart(env):
    a, a2, ab = await stores(env, "s", "s2", "s\x00")
    (other_topic,) = await stores(env, "s", topic="persistent://public/default/other")
    for index, store in enumerate((a, a2, ab, other_topic)):
        await store.append_cumulative(TxnId(index, 0), Position(1, index))[1]
    for index, store in enumerate((a, a2, ab, other_topic)):
        assert [logged.txn for logged in all_records(store)] == [TxnId(index, 0)]
    await a.delete()
    assert all_records(a) == []
    assert all(len(all_records(store)) == 1 for store in (a2, ab, other_topic))


async def test_sequences_continue_after_a_restart_and_deletions(env, reopen):
    (store,) = await stores(env, "s")
    for least in range(3):
        await store.append_cumulative(TxnId(1, least), Position(1, least))[1]
    await store.delete_records([0, 1])
    (again,) = await stores(reopen(env), "s")
    seq, written = again.append_cumulative(TxnId(1, 9), Position(1, 9))
    await written
    assert seq == 3
    assert [logged.seq for logged in all_records(again)] == [2, 3]


async def test_a_chunked_scan_visits_every_record_once_and_ends(env):
    (store,) = await stores(env, "s")
    for least in range(7):
        store.append_cumulative(TxnId(1, least), Position(1, least))
    await env.barrier()
    for chunk_size in (1, 2, 3, 7, 8):
        chunks = list(store.scan(chunk_size))
        assert [logged.seq for chunk in chunks for logged in chunk] == list(range(7))
        assert all(len(chunk) <= chunk_size for chunk in chunks)
    with pytest.raises(ValueError):
        list(store.scan(0))


async def test_a_read_failure_is_reported_not_retried(env):
    (store,) = await stores(env, "s")
    await store.append_cumulative(T1, Position(1, 1))[1]
    reads = []

    def failing(start, chunk_size):
        reads.append(start)
        raise OSError(5, "simulated read error")

    store._read_chunk = failing
    with pytest.raises(PendingAckReplayError, match=r"log/s: cannot read the records from the start"):
        list(store.scan(10))
    assert len(reads) == 1


async def test_a_scan_that_fails_half_way_does_not_make_appends_overwrite_records(env):
    (store,) = await stores(env, "s")
    for least in range(5):
        store.append_cumulative(TxnId(1, least), Position(1, least))
    await env.barrier()
    (fresh,) = await stores(env, "s")
    key, db = fresh._key(3), env.db("pending_ack")
    await env.submit(lambda txn: txn.put(key, b"\xff", db=db))
    with pytest.raises(PendingAckReplayError, match="record 3"):
        list(fresh.scan(2))
    seq, written = fresh.append_cumulative(T2, Position(1, 9))
    await written
    assert seq == 5
