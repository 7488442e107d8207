"""Embedded producers past a producer_request_hold backlog quota are held as a network client's
producer is (its client retries the refused PRODUCER at its reconnect back-off): creating one, and
sending with one the broker closed for the quota, wait until the backlog is back under the quota,
for up to the producer's send_timeout_ms, then raise ProducerBlockedQuotaExceededError. Past a
producer_exception quota they fail at once."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.broker import Broker
from pyengine.broker.backlog_quota import REFUSED
from pyengine.broker.embedded import ClosedError
from pyengine.errors import ProducerBlockedQuotaExceededError, ProducerBlockedQuotaExceededException

from tests.broker.helpers import drain

T = "persistent://public/default/embedded-backlog-quota-hold"
PAYLOAD = b"x" * 100
STILL_WAITING_S = 0.5                # how long a held creation or send is seen not to finish


def _embedded(tmp_path, policy="producer_request_hold"):
    return Broker.embedded(tmp_path, sync=False, backlog_quota_default_limit_bytes=300,
                           backlog_quota_default_retention_policy=policy)


async def _past_the_quota(broker):
    """The topic with a subscription whose backlog (5 x 100 bytes and more) is past 300 bytes."""
    topic = await broker.service.get_topic(T)
    await topic.open_subscription("slow")
    producer = await broker.create_producer(T)
    for _ in range(5):
        await producer.send(PAYLOAD)
    return topic, producer


async def _consume_the_backlog(broker):
    consumer = await broker.subscribe(T, "slow")
    for message in await drain(consumer):
        await consumer.acknowledge(message)
    return consumer


async def _still_waiting(*operations) -> bool:
    done, _ = await asyncio.wait(operations, timeout=STILL_WAITING_S)
    return not done


async def test_a_producer_created_past_the_quota_waits_until_the_backlog_is_consumed(tmp_path):
    async with _embedded(tmp_path) as broker:
        topic, _ = await _past_the_quota(broker)
        creating = asyncio.ensure_future(broker.create_producer(T, producer_name="held"))
        assert await _still_waiting(creating)
        await _consume_the_backlog(broker)
        producer = await asyncio.wait_for(creating, 5)
        assert producer.producer_name == "held" and "held" in topic.producers


async def test_a_held_creation_fails_with_the_refusal_after_the_send_timeout(tmp_path):
    async with _embedded(tmp_path) as broker:
        topic, _ = await _past_the_quota(broker)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(ProducerBlockedQuotaExceededError, match=f"^{REFUSED}$"):
            await broker.create_producer(T, producer_name="held", send_timeout_ms=400)
        assert loop.time() - started >= 0.4
        assert "held" not in topic.producers


async def test_producer_exception_still_refuses_a_creation_at_once(tmp_path):
    async with _embedded(tmp_path, "producer_exception") as broker:
        await _past_the_quota(broker)
        creating = asyncio.ensure_future(broker.create_producer(T))
        done, _ = await asyncio.wait({creating}, timeout=5)      # not held (30 s by default)
        assert done and isinstance(creating.exception(), ProducerBlockedQuotaExceededException)


async def test_sends_of_a_producer_closed_past_the_quota_wait_and_keep_their_order(tmp_path):
    async with _embedded(tmp_path) as broker:
        topic, producer = await _past_the_quota(broker)
        await broker.service.backlog_quotas.check_now()          # closes the producer
        assert topic.producers == {}
        sends = [asyncio.ensure_future(producer.send(b"m%d" % i)) for i in range(3)]
        assert await _still_waiting(*sends)
        consumer = await _consume_the_backlog(broker)
        ids = await asyncio.wait_for(asyncio.gather(*sends), 5)
        assert ids == sorted(ids)
        assert [m.data for m in await drain(consumer)] == [b"m0", b"m1", b"m2"]
        assert list(topic.producers) == [producer.producer_name]
        assert producer.last_sequence_id == 7


async def test_a_held_send_fails_with_the_refusal_after_the_send_timeout_and_is_not_stored(tmp_path):
    async with _embedded(tmp_path) as broker:
        topic = await broker.service.get_topic(T)
        await topic.open_subscription("slow")
        producer = await broker.create_producer(T, send_timeout_ms=300)
        for _ in range(5):
            await producer.send(PAYLOAD)
        await broker.service.backlog_quotas.check_now()
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(ProducerBlockedQuotaExceededError, match=f"^{REFUSED}$"):
            await producer.send(b"late")
        assert loop.time() - started >= 0.3
        assert topic.subscriptions["slow"].backlog() == 5
        await _consume_the_backlog(broker)
        await producer.send(b"again")                            # attached again


async def test_a_send_cancelled_while_held_is_not_stored_and_lets_the_next_one_go(tmp_path):
    async with _embedded(tmp_path) as broker:
        topic, producer = await _past_the_quota(broker)
        await broker.service.backlog_quotas.check_now()
        given_up = asyncio.ensure_future(producer.send(b"given up"))
        after = asyncio.ensure_future(producer.send(b"after"))
        assert await _still_waiting(given_up, after)
        given_up.cancel()
        consumer = await _consume_the_backlog(broker)
        await asyncio.wait_for(after, 5)
        assert given_up.cancelled()
        assert [m.data for m in await drain(consumer)] == [b"after"]


async def test_closing_a_producer_fails_its_held_sends(tmp_path):
    async with _embedded(tmp_path) as broker:
        _, producer = await _past_the_quota(broker)
        await broker.service.backlog_quotas.check_now()
        held = asyncio.ensure_future(producer.send(b"held"))
        assert await _still_waiting(held)
        await producer.close()
        with pytest.raises(ClosedError):
            await asyncio.wait_for(held, 5)


async def test_a_producer_closed_past_a_producer_exception_quota_fails_its_send_at_once(tmp_path):
    async with _embedded(tmp_path, "producer_exception") as broker:
        _, producer = await _past_the_quota(broker)
        await broker.service.backlog_quotas.check_now()
        sending = asyncio.ensure_future(producer.send(b"refused"))
        done, _ = await asyncio.wait({sending}, timeout=5)
        assert done and isinstance(sending.exception(), ProducerBlockedQuotaExceededException)
