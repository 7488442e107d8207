"""`Producer.send(..., deliver_after=, deliver_at=)` as pulsar-client's: a timedelta from now or
ms since the epoch, set as MessageMetadata.deliver_at_time; a delayed message is never batched
(the C++ client's canAddToBatch), in a transaction too; bad values fail at the call; and the
broker refuses a delay beyond the policy's maxDeliveryDelayInMillis with NotAllowedError
(Pulsar's "Exceeds max allowed delivery delay"), the connection staying up."""

from __future__ import annotations

import asyncio
import datetime
import time

import pytest

from pyengine.broker.delayed import deliver_at_time
from pyengine.client import NotAllowedError
from pyengine.client.producer import MAX_DELIVER_AT_MS, check_delivery
from pyengine_kernels import Position
from tests.client.conftest import drain

TOPIC = "persistent://public/default/delayed-send"
SECOND = datetime.timedelta(seconds=1)


def now_ms() -> int:
    return int(time.time() * 1000)


def stored_deliver_at(broker, message_id) -> int | None:
    topic = broker.service.topics[TOPIC]
    entry = topic.ledger.read_entry(Position(message_id.ledger_id, message_id.entry_id))
    return deliver_at_time(entry.data)


# --- the arguments -----------------------------------------------------------------------

@pytest.mark.parametrize("deliver_after, deliver_at, error", [
    (1000, None, TypeError),                         # pulsar-client: a timedelta, not ms
    (1.5, None, TypeError),
    ("1s", None, TypeError),
    (None, 1.5e12, TypeError),                        # ms since the epoch: an int
    (None, True, TypeError),
    (None, datetime.datetime.now(datetime.timezone.utc), TypeError),
    (None, "1700000000000", TypeError),
    (-SECOND, None, ValueError),
    (None, -1, ValueError),
    (None, MAX_DELIVER_AT_MS + 1, ValueError),
    (datetime.timedelta(days=3_000_000), None, ValueError),
    pytest.param(SECOND, now_ms() + 1000, ValueError, id="both"),    # (an id that does not change with the clock)
])
def test_bad_values_are_refused(deliver_after, deliver_at, error):
    with pytest.raises(error):
        check_delivery(deliver_after, deliver_at)


def test_values():
    assert check_delivery(None, None) is None
    assert check_delivery(datetime.timedelta(0), None) is None      # as pulsar-client: 0 sets nothing
    assert check_delivery(None, 0) is None
    assert check_delivery(None, 1_700_000_000_000) == 1_700_000_000_000
    before = now_ms()
    at = check_delivery(datetime.timedelta(seconds=5, microseconds=1500), None)
    assert before + 5001 <= at <= now_ms() + 5001


async def test_bad_values_fail_at_the_call_and_send_nothing(broker, client):
    producer = await client.create_producer(TOPIC)
    with pytest.raises(TypeError):
        await producer.send(b"x", deliver_after=1000)
    with pytest.raises(ValueError):
        producer.send_async(b"x", deliver_at=-5)
    with pytest.raises(ValueError):
        await producer.send(b"x", deliver_after=SECOND, deliver_at=now_ms())
    assert broker.service.topics[TOPIC].ledger.number_of_entries == 0
    assert (await producer.send(b"ok")).entry_id == 0


# --- on the wire ---------------------------------------------------------------------------

@pytest.mark.parametrize("batching", [False, True])
async def test_deliver_after_and_deliver_at_set_deliver_at_time(broker, client, batching):
    producer = await client.create_producer(TOPIC, batching_enabled=batching)
    before = now_ms()
    after_id = await producer.send(b"after", deliver_after=datetime.timedelta(seconds=30))
    at_id = await producer.send(b"at", deliver_at=before + 60_000)
    plain_id = await producer.send(b"plain")
    assert before + 30_000 <= stored_deliver_at(broker, after_id) <= now_ms() + 30_000
    assert stored_deliver_at(broker, at_id) == before + 60_000
    assert stored_deliver_at(broker, plain_id) is None
    assert after_id.batch_index == at_id.batch_index == -1      # sent alone, also with batching


async def test_a_delayed_message_is_never_batched_and_keeps_send_order(broker, client):
    producer = await client.create_producer(TOPIC, batching_enabled=True, batching_max_messages=100,
                                            batching_max_publish_delay_ms=50)
    futures = [producer.send_async(b"a0"), producer.send_async(b"a1"),
               producer.send_async(b"delayed", deliver_after=datetime.timedelta(minutes=5)),
               producer.send_async(b"b0", key="k"), producer.send_async(b"b1")]
    ids = await asyncio.gather(*futures)
    # a0, a1: one batch (flushed before the delayed one), the delayed one alone, b0, b1: a batch
    assert [i.entry_id for i in ids] == [0, 0, 1, 2, 2]
    assert [i.batch_index for i in ids] == [0, 1, -1, 0, 1]
    assert stored_deliver_at(broker, ids[2]) is not None
    assert stored_deliver_at(broker, ids[0]) is None


async def test_shared_subscription_receives_a_delayed_send_at_its_time(client):
    consumer = await client.subscribe(TOPIC, "s", consumer_type="shared")
    producer = await client.create_producer(TOPIC, batching_enabled=True)
    sent = time.monotonic()
    producer.send_async(b"later", deliver_after=datetime.timedelta(milliseconds=1200))
    await producer.send(b"now")
    first = await consumer.receive(timeout=5)
    assert first.data == b"now"
    await consumer.acknowledge(first)
    second = await consumer.receive(timeout=5)
    assert second.data == b"later"
    assert time.monotonic() - sent >= 1.15
    await consumer.acknowledge(second)


async def test_a_delayed_message_in_a_transaction_is_sent_alone(broker, client):
    consumer = await client.subscribe(TOPIC, "s", consumer_type="shared")
    producer = await client.create_producer(TOPIC, batching_enabled=True, batching_max_publish_delay_ms=50)
    txn = await client.new_transaction()
    futures = [producer.send_async(b"t0", txn=txn),
               producer.send_async(b"t-delayed", txn=txn, deliver_after=datetime.timedelta(milliseconds=800)),
               producer.send_async(b"t1", txn=txn)]
    await txn.commit()
    ids = await asyncio.gather(*futures)
    assert ids[1].batch_index == -1 and len({i.entry_id for i in ids}) == 3
    got = [m.data for m in await drain(consumer, timeout=2.0)]
    assert got == [b"t0", b"t1", b"t-delayed"]


# --- the broker's limit (PIP-315) ----------------------------------------------------------------

async def set_policy(broker, **policy) -> None:
    await broker.service.policies.set_topic_policy(TOPIC, "delayedDeliveryPolicies", policy)


async def test_a_delay_beyond_max_delivery_delay_is_refused(broker, client):
    producer = await client.create_producer(TOPIC)
    await producer.send(b"first")              # the topic exists
    await set_policy(broker, active=True, tickTime=1000, maxDeliveryDelayInMillis=2000)
    connection = producer._partitions[0].connection
    with pytest.raises(NotAllowedError, match="Exceeds max allowed delivery delay of 2000 milliseconds"):
        await producer.send(b"too-late", deliver_after=datetime.timedelta(seconds=30))
    with pytest.raises(NotAllowedError):
        await producer.send(b"too-late-at", deliver_at=now_ms() + 10_000)
    assert (await producer.send(b"within", deliver_after=SECOND)).entry_id == 1
    assert (await producer.send(b"in-the-past", deliver_at=1)).entry_id == 2
    assert (await producer.send(b"plain")).entry_id == 3
    assert producer._partitions[0].connection is connection        # one send refused, not the connection
    txn = await client.new_transaction()
    with pytest.raises(NotAllowedError):
        await producer.send(b"txn-too-late", txn=txn, deliver_after=datetime.timedelta(minutes=1))
    await txn.abort()


@pytest.mark.parametrize("policy", [dict(active=True, tickTime=1000, maxDeliveryDelayInMillis=0),
                                    dict(active=False, tickTime=1000, maxDeliveryDelayInMillis=1000)])
async def test_no_limit_when_max_is_0_or_delayed_delivery_is_off(broker, client, policy):
    producer = await client.create_producer(TOPIC)
    await producer.send(b"first")
    await set_policy(broker, **policy)
    assert (await producer.send(b"far", deliver_after=datetime.timedelta(days=365))).entry_id == 1


async def test_the_namespace_limit_applies(broker, client):
    import dataclasses
    policies = broker.service.policies
    namespace = policies.policies("public/default")
    await policies.set_policies("public/default", dataclasses.replace(
        namespace, delayed_delivery={"active": True, "tickTime": 1000, "maxDeliveryDelayInMillis": 500}))
    producer = await client.create_producer(TOPIC)
    with pytest.raises(NotAllowedError, match="500 milliseconds"):
        await producer.send(b"too-late", deliver_after=SECOND)
