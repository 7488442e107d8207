"""A send whose entry is appended later than the send is accepted (the first transactional send
on a topic, which waits for the topic to be marked transactional; any send to a v5 `segment://`
topic, whose buffer appends from a task) cannot have its de-duplication record in the entry's
own write. A crash between the entry's commit and the record's must not let a retry of the
same sequence id be stored a second time after the restart: the restart recovers the sequence
id from the stored entries (as Pulsar replays the entries after its de-duplication snapshot)."""

import contextlib

from pyengine.broker import Broker
from pyengine.broker.embedded import MessageId
from tests.broker.helpers import drain

T = "persistent://public/default/dedup-late-entries"
SEGMENT = "segment://public/default/dedup-late-entries/0000-ffff-0"


class CrashAfterEntryCommit:
    """Lets group commits through until one has written an entry, then fails every later one:
    what a kill -9 right after that commit leaves on disk."""

    def __init__(self, env) -> None:
        self.env = env
        self.original = env._write_batch
        self.entries_db = env.db("entries")
        self.crashed = False
        env._write_batch = self._write

    def _write(self, writes):
        if self.crashed:
            raise RuntimeError("crashed")
        before = self._stored_entries()
        result = self.original(writes)
        if self._stored_entries() != before:
            self.crashed = True
        return result

    def _stored_entries(self) -> int:
        # counted rather than watched through a wrapped transaction: the metadata store nests
        # transactions in the batch's, which LMDB allows only under a real one
        with self.env._env.begin() as txn:
            return txn.stat(self.entries_db)["entries"]


async def _crash_after_the_entry_of(broker, send) -> None:
    crash = CrashAfterEntryCommit(broker.service.env)
    with contextlib.suppress(Exception):
        await send
    assert crash.crashed, "the entry was never committed"


async def _close_crashed(stack, broker) -> None:
    with contextlib.suppress(Exception):
        await stack.__aexit__(None, None, None)
    broker.service.env.close()          # (if closing failed on the writes it could not make)


async def test_a_first_transactional_send_retried_after_a_crash_is_stored_once(tmp_path):
    stack = Broker.embedded(tmp_path, deduplication_enabled=True)
    broker = await stack.__aenter__()
    try:
        producer = await broker.create_producer(T, producer_name="p")
        await producer.send(b"plain", sequence_id=0)
        txn = await broker.new_transaction()
        await _crash_after_the_entry_of(broker, producer.send(b"t1", sequence_id=1, txn=txn))
    finally:
        await _close_crashed(stack, broker)
    async with Broker.embedded(tmp_path, deduplication_enabled=True) as broker:
        producer = await broker.create_producer(T, producer_name="p")
        assert producer.last_sequence_id == 1
        txn = txn._rebound(broker.service)
        assert await producer.send(b"t1", sequence_id=1, txn=txn) == MessageId(-1, -1)
        await txn.commit()
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        assert [m.data for m in await drain(consumer)] == [b"plain", b"t1"]


async def test_a_v5_transactional_send_retried_after_a_crash_is_stored_once(tmp_path):
    stack = Broker.embedded(tmp_path, deduplication_enabled=True)
    broker = await stack.__aenter__()
    try:
        producer = await broker.create_producer(SEGMENT, producer_name="p")
        await producer.send(b"m0", sequence_id=0)
        txn = await broker.new_transaction(version=5)
        await producer.send(b"t1", sequence_id=1, txn=txn)
        await _crash_after_the_entry_of(broker, producer.send(b"t2", sequence_id=2, txn=txn))
    finally:
        await _close_crashed(stack, broker)
    async with Broker.embedded(tmp_path, deduplication_enabled=True) as broker:
        producer = await broker.create_producer(SEGMENT, producer_name="p")
        assert producer.last_sequence_id == 2
        txn = txn._rebound(broker.service)
        assert await producer.send(b"t2", sequence_id=2, txn=txn) == MessageId(-1, -1)
        await txn.commit()
        assert (await producer.send(b"m3", sequence_id=3)).entry_id >= 0
        consumer = await broker.subscribe(SEGMENT, "s", initial_position="earliest")
        assert [m.data for m in await drain(consumer)] == [b"m0", b"t1", b"t2", b"m3"]


async def test_the_replay_stops_being_needed_once_the_records_are_written(tmp_path):
    # Nothing crashed: the records of late entries are written, and a restart replays nothing
    # (the marker saying where a replay would start is gone).
    async with Broker.embedded(tmp_path, deduplication_enabled=True) as broker:
        producer = await broker.create_producer(SEGMENT, producer_name="p")
        txn = await broker.new_transaction(version=5)
        for i in range(3):
            await producer.send(b"m%d" % i, sequence_id=i, txn=txn)
        await txn.commit()
        dedup = broker.service.topics[SEGMENT].dedup
        await broker.service.env.drain()
        assert dedup._stored_replay_start() is None
    async with Broker.embedded(tmp_path, deduplication_enabled=True) as broker:
        producer = await broker.create_producer(SEGMENT, producer_name="p")
        assert producer.last_sequence_id == 2
