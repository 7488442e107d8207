"""A dispatch pass whose storage read fails part way: what it already gave out (taken from
the consumer's permits, put in its pending acks, the cursor's read position moved past it)
must still reach the consumer, an entry taken out of the replays to be read again must stay
to be delivered again, and the pass is tried again later (as Pulsar's dispatchers retry a
failed read after a backoff) - before, those entries were held for the consumer without ever
being sent, and nothing was read again until something else woke the dispatcher."""

from __future__ import annotations

from pyengine.broker import Broker
from pyengine.storage.errors import StorageError

from .helpers import drain

T = "persistent://public/default/dispatch-after-a-failed-read"


def fail_once(target, name: str, on_call: int) -> None:
    """Make the `on_call`-th call of `target.name` raise a StorageError (once)."""
    original = getattr(target, name)
    calls = 0

    def failing(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls == on_call:
            raise StorageError("injected read failure")
        return original(*args, **kwargs)
    setattr(target, name, failing)


async def test_entries_read_before_a_failed_read_are_delivered_and_the_rest_follow(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        for i in range(250):                        # more than one read (READ_BATCH is 200)
            await producer.send(b"m%d" % i)
        ledger = broker.service.topics[T].ledger
        fail_once(ledger, "read_entries", 2)        # the pass's second read fails
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        got = await drain(consumer, timeout=0.5)
        assert [m.data for m in got] == [b"m%d" % i for i in range(250)]


async def test_a_replay_whose_read_fails_is_delivered_again_later(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="shared", initial_position="earliest",
                                          negative_ack_redelivery_delay_ms=0)
        await producer.send(b"m0")
        first = await consumer.receive(timeout=2)
        ledger = broker.service.topics[T].ledger
        fail_once(ledger, "read_entry", 1)          # reading the replayed entry fails
        await consumer.negative_acknowledge(first)
        again = await consumer.receive(timeout=2)
        assert again.data == b"m0"

