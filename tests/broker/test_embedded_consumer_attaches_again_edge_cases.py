"""More of an embedded consumer (or reader) attaching again after the broker closed its
subscription, as the network client's reconnects (and Java's, C++'s):

- a reader resumes at the first message it has not handed out: the first queued one, inclusive
  (Java's clearReceiverQueue), else after the last handed out. One that had handed out nothing
  restarted at its configured start (at latest: the reloaded topic's end; sought by time: past
  what was dispatched into its queue), and its queued messages were lost;
- that one-time resume point does not change a start-inclusive reader's later seeks;
- it attaches again after every close, also one while it was attaching;
- a transient failure while attaching (a cursor not saved) is retried with back-off, as the
  network client reconnects after any error not fatal; a fatal one closes it, and its
  operations raise that failure (as the network client's), not AlreadyClosedError, which a
  MultiTopicsConsumer takes for "closed by us" (it dropped the topic silently);
- a durable consumer's seek filters only the target's own entry, as the network client's: the
  entries before it that its subscription delivers later (made again at earliest) are its own;
  the filter is kept across attachments, as the network client (and Java) keep it across
  reconnects."""

from __future__ import annotations

import asyncio
import logging

import pytest

from pyengine.broker import Broker
from pyengine.broker.embedded import ClosedError, EmbeddedClient
from pyengine.client.message import MessageId
from pyengine.broker import embedded
from pyengine.errors import ServiceNotReadyError, TopicNotFoundError
from tests.broker.test_embedded_consumer_attaches_again import reload
from tests.storage.helpers import fail_next_save

T = "persistent://public/default/attached-again-more"


async def attached(consumer) -> None:
    for _ in range(500):
        if consumer._attaching is None:
            return
        await asyncio.sleep(0.01)
    pytest.fail("never attached again")


async def read_all(reader, timeout: float = 0.5) -> list[bytes]:
    got = []
    with pytest.raises(TimeoutError):
        while True:
            got.append((await reader.read_next(timeout=timeout)).data)
    return got


async def queued(consumer, count: int) -> None:
    for _ in range(500):
        if len(consumer._queue) >= count:
            return
        await asyncio.sleep(0.01)
    pytest.fail(f"{len(consumer._queue)} queued, not {count}")


async def test_a_reader_started_at_latest_keeps_its_queued_messages(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        await producer.send(b"before")
        reader = await broker.create_reader(T, MessageId.latest)
        for i in range(3):
            await producer.send(b"m%d" % i)
        await queued(reader, 3)                 # queued, none handed out
        await reload(broker, T)
        await attached(reader)
        assert await read_all(reader) == [b"m0", b"m1", b"m2"]


async def test_a_reader_sought_by_time_keeps_its_queued_messages(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        for i in range(3):
            await producer.send(b"m%d" % i)
        reader = await broker.create_reader(T, MessageId.earliest)
        await reader.seek(0)                    # by publish time: everything
        await queued(reader, 3)
        await reload(broker, T)
        await attached(reader)
        assert await reader.has_message_available()
        assert await read_all(reader) == [b"m0", b"m1", b"m2"]


async def test_a_reader_resumes_at_its_first_queued_message_after_what_it_handed_out(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        for i in range(4):
            await producer.send(b"m%d" % i)
        reader = await broker.create_reader(T, MessageId.earliest, receiver_queue_size=10)
        assert (await reader.read_next(timeout=5)).data == b"m0"
        await queued(reader, 3)
        await reload(broker, T)
        await attached(reader)
        assert await read_all(reader) == [b"m1", b"m2", b"m3"]


async def test_a_start_inclusive_reader_seeks_inclusively_after_attaching_again(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        ids = [await producer.send(b"m%d" % i) for i in range(3)]
        reader = await broker.create_reader(T, MessageId.earliest, start_message_id_inclusive=True,
                                            receiver_queue_size=1)
        assert (await reader.read_next(timeout=5)).data == b"m0"
        await reload(broker, T)
        await attached(reader)
        assert (await reader.read_next(timeout=5)).data == b"m1"
        await reader.seek(ids[1])
        assert (await reader.read_next(timeout=5)).data == b"m1"        # the id's message again


async def test_a_consumer_attaches_again_when_deleted_again_while_it_attached(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        service = broker.service
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        await service.delete_topic(T)
        assert consumer._attaching is not None
        # Deleted again as soon as it is back with its subscription's consumer (its attachment
        # not over yet): the broker closes that new subscription under it too.
        for _ in range(100_000):
            topic = service.topics.get(T)
            if topic is not None and "s" in topic.subscriptions and topic.subscriptions["s"].consumers:
                break
            await asyncio.sleep(0)
        else:
            pytest.fail("never subscribed again")
        assert consumer._attaching is not None
        await service.delete_topic(T)
        await attached(consumer)
        await producer.send(b"new")                     # (it creates the topic again)
        assert (await consumer.receive(timeout=5)).data == b"new"
        assert not consumer._topic.closed
        assert [c.sink for c in service.topics[T].subscriptions["s"].consumers] == [consumer]


def fail_a_cursor_save_after_unsubscribing(topic) -> list:
    """The topic's subscription is deleted (the broker closes it under its consumer), and the
    next cursor save fails once (the new subscription's: a disk hiccup)."""
    failed: list = []
    delete_cursor = topic.ledger.delete_cursor

    async def then_fail(*args, **kwargs):
        await delete_cursor(*args, **kwargs)
        fail_next_save(topic.ledger.env, "cursor", failed)
    topic.ledger.delete_cursor = then_fail
    return failed


async def test_a_transient_failure_while_attaching_again_is_retried(tmp_path, caplog):
    caplog.set_level(logging.CRITICAL)
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        topic = broker.service.topics[T]
        failed = fail_a_cursor_save_after_unsubscribing(topic)
        await topic.unsubscribe("s", force=True)
        await attached(consumer)
        assert failed                                   # it failed once
        assert not consumer._closed
        await producer.send(b"m")
        assert (await consumer.receive(timeout=5)).data == b"m"


async def test_a_consumer_closed_by_a_failure_raises_it_then_closed_error_once_closed(tmp_path, monkeypatch):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s")
        fatal_once(monkeypatch)
        waiting = asyncio.ensure_future(consumer.receive(timeout=5))
        await broker.service.topics[T].unsubscribe("s", force=True)
        with pytest.raises(TopicNotFoundError):
            await waiting
        with pytest.raises(TopicNotFoundError):
            await consumer.acknowledge(MessageId(1, 0))
        await consumer.close()
        with pytest.raises(ClosedError):
            await consumer.receive(timeout=0.1)


def fatal_once(monkeypatch) -> None:
    """The next attachment again (after the broker closed a subscription) fails fatally."""
    attachable = EmbeddedClient._attachable_topic
    failed = []

    async def refused(self, name, *, again=False):
        if again and not failed:
            failed.append(name)
            raise TopicNotFoundError(f"injected: {name} is not found")
        return await attachable(self, name, again=again)
    monkeypatch.setattr(EmbeddedClient, "_attachable_topic", refused)


async def test_a_multi_topics_consumer_subscribes_again_a_topic_whose_consumer_failed(tmp_path, monkeypatch,
                                                                                     caplog):
    caplog.set_level(logging.CRITICAL)
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        multi = await broker.subscribe([T, T + "-2"], "s", initial_position="earliest")
        child = multi._consumers[T]
        fatal_once(monkeypatch)
        await broker.service.topics[T].unsubscribe("s", force=True)
        await producer.send(b"m")
        assert (await multi.receive(timeout=5)).data == b"m"      # from its consumer made again
        assert child._closed and multi._consumers[T] is not child


async def test_a_durable_consumers_seek_filters_only_its_target_entry(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        ids = [await producer.send(b"m%d" % i) for i in range(5)]
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        for _ in range(5):
            await consumer.receive(timeout=5)
        await consumer.seek(ids[3])
        assert (await consumer.receive(timeout=5)).data == b"m4"
        topic = broker.service.topics[T]
        await topic.unsubscribe("s", force=True)        # made again at earliest as it attaches again
        await attached(consumer)
        got = []
        with pytest.raises(TimeoutError):
            while True:
                message = await consumer.receive(timeout=0.5)
                got.append(message.data)
                await consumer.acknowledge(message)
        # The target's entry stays filtered, as by the network client (and Java, which keeps
        # startMessageId across reconnects): it stays in the backlog.
        assert got == [b"m0", b"m1", b"m2", b"m4"]
        assert topic.subscriptions["s"].backlog() == 1



async def test_a_bug_while_attaching_again_closes_the_consumer_with_it(tmp_path, monkeypatch, caplog):
    """Not a broker's, storage's or metadata store's error (an AttributeError: a bug) is not
    retried, which would hide it behind back-offs for ever: the consumer closes with it."""
    async with Broker.embedded(tmp_path, sync=False) as broker:
        await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s")
        real = EmbeddedClient._attachable_topic
        attempts = []

        async def broken(self, name, *, again=False):
            if again:
                attempts.append(name)
                raise AttributeError("'NoneType' object has no attribute 'ledger'")
            return await real(self, name, again=again)

        monkeypatch.setattr(EmbeddedClient, "_attachable_topic", broken)
        with caplog.at_level(logging.WARNING, logger="pyengine.broker.embedded"):
            await broker.service.topics[T].unsubscribe("s", force=True)
            with pytest.raises(Exception, match="AttributeError: 'NoneType' object has no attribute 'ledger'"):
                await asyncio.wait_for(consumer.acknowledge(MessageId(1, 0)), 5)
        assert attempts == [T]
        assert any("attaching it again failed" in record.getMessage() for record in caplog.records)



async def test_operations_waiting_for_an_attachment_that_keeps_failing_time_out(tmp_path, monkeypatch):
    """As the network client's operations waiting for its reconnect: TimeoutError after the
    operation timeout, while the attachment goes on trying (it waited for ever)."""
    monkeypatch.setattr(embedded, "_OPERATION_TIMEOUT_MS", 300)
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s")
        real = EmbeddedClient._attachable_topic
        refusing = True

        async def refused(self, name, *, again=False):
            if again and refusing:
                raise ServiceNotReadyError("the broker is not ready")
            return await real(self, name, again=again)

        monkeypatch.setattr(EmbeddedClient, "_attachable_topic", refused)
        await broker.service.topics[T].unsubscribe("s", force=True)
        with pytest.raises(TimeoutError, match="did not attach again within the operation timeout"):
            await consumer.acknowledge(MessageId(1, 0))
        refusing = False
        await attached(consumer)
        await producer.send(b"then")                            # attached again: goes on
        message = await consumer.receive(timeout=5)
        await consumer.acknowledge(message)
