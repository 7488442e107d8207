"""De-duplication switched off and on again by policy starts afresh, as Apache's does (its
MessageDeduplication deletes its cursor and clears its maps when disabled): sequence ids
remembered from before it was switched off must not drop the messages a producer of the
same name sends after it is switched on again."""

import asyncio

from pyengine.broker import Broker
from pyengine.errors import PersistenceError
from pyengine_kernels import Position
from tests.broker.helpers import drain

T = "persistent://public/default/dedup-toggled"


async def _set_dedup(broker, enabled: bool) -> None:
    await broker.service.policies.set_topic_policy(T, "deduplicationEnabled", enabled)
    broker.service.refresh_policies()


async def test_sequence_ids_from_before_dedup_was_disabled_drop_nothing_after_it_is_enabled_again(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        await _set_dedup(broker, True)
        old = await broker.create_producer(T, producer_name="app")
        for i in range(5):
            await old.send(b"old-%d" % i)                   # sequence ids 0..4
        await old.close()
        await _set_dedup(broker, False)
        # The application restarts without de-duplication: it numbers from 0 again.
        new = await broker.create_producer(T, producer_name="app")
        assert new.last_sequence_id == -1
        for i in range(2):
            await new.send(b"new-%d" % i)                   # 0, 1
        await _set_dedup(broker, True)
        sent = [await new.send(b"new-%d" % i) for i in range(2, 6)]     # 2..5: never seen with dedup on
        assert all(message_id.entry_id >= 0 for message_id in sent), sent
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        received = [m.data for m in await drain(consumer)]
        assert received == [b"old-%d" % i for i in range(5)] + [b"new-%d" % i for i in range(6)]


async def test_records_of_a_topic_loaded_with_dedup_disabled_are_not_used_when_it_is_enabled(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        await _set_dedup(broker, True)
        old = await broker.create_producer(T, producer_name="app")
        for i in range(5):
            await old.send(b"old-%d" % i)
        await _set_dedup(broker, False)
    async with Broker.embedded(tmp_path) as broker:         # loaded with dedup off
        new = await broker.create_producer(T, producer_name="app")
        await new.send(b"new-0")                            # 0
        await _set_dedup(broker, True)
        assert (await new.send(b"new-1")).entry_id >= 0     # 1: never seen with dedup on


async def test_a_send_in_flight_when_dedup_was_switched_off_does_not_count_after_it_is_on_again(tmp_path):
    """A send accepted with de-duplication on and settled only after it was switched off and
    on again belongs to the forgotten numbering: its sequence id (here 100) recorded then made
    the producer's renumbered sends (1, 2, ...) duplicates, and its in-flight entry answered a
    new send of the same id as a duplicate of it."""
    async with Broker.embedded(tmp_path) as broker:
        await _set_dedup(broker, True)
        producer = await broker.create_producer(T, producer_name="app")
        await producer.send(b"first")
        dedup = broker.service.topics[T].dedup
        old_write = asyncio.get_running_loop().create_future()     # stands for a write in flight
        dedup.record("app", 100, old_write)
        dedup.enabled = False
        dedup.enabled = True
        new_write = asyncio.get_running_loop().create_future()
        dedup.record("app", 100, new_write)                  # the new numbering reached 100 too
        old_write.set_result(Position(99, 0))
        await asyncio.sleep(0)
        assert dedup.duplicate_of("app", 100, 100) is new_write
        new_write.set_exception(PersistenceError("not stored"))
        new_write.exception()
        await asyncio.sleep(0)
        assert dedup.last_sequence_id("app") == -1
        assert dedup.duplicate_of("app", 1, 1) is None
