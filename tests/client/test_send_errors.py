"""SEND_ERROR as the producer handles it (PartitionProducer.on_send_error): the codes that reject
one message fail that send only, with the class of its code, and keep the connection; any other
code means the broker may have dropped the sends after it too, so the producer drops the
connection, connects again and resends what is pending, which is then stored once.

The in-process broker answers for real; only its Topic.publish is wrapped to fail a chosen send
(nothing stored, the failure's code sent back in SEND_ERROR), as a broker whose storage fails does.
"""

from __future__ import annotations

import asyncio

import pytest

import pyengine.client
from pyengine.client import Client
from pyengine.client.producer import _REJECTING
from pyengine.protocol import pulsar_api_pb2 as pb
from tests.client.conftest import drain

TOPIC = "persistent://public/default/send-errors"

# The codes after which the connection stays (and the error class the send fails with).
REJECTING = {
    pb.ChecksumError: pyengine.client.ChecksumError,
    pb.NotAllowedError: pyengine.client.NotAllowedError,
    pb.InvalidTxnStatus: pyengine.client.InvalidTxnStatusError,
    pb.TransactionNotFound: pyengine.client.TransactionNotFoundError,
    pb.TransactionConflict: pyengine.client.TransactionConflictError,
    pb.ExpiredTransaction: pyengine.client.ExpiredTransactionError,
    pb.TopicTerminatedError: pyengine.client.TopicTerminatedError,
}
# Some of the others: the connection is dropped and the send retried.
RETRIED = {
    pb.PersistenceError: pyengine.client.PersistenceError,
    pb.ServiceNotReady: pyengine.client.ServiceNotReadyError,
    pb.MetadataError: pyengine.client.MetadataError,
    pb.UnknownError: pyengine.client.PulsarError,
}


def fail_publish(monkeypatch, broker, error_class: type[Exception], *, failing: set[bytes]) -> list[bytes]:
    """Make the broker's topic fail the first publish of each payload in `failing` with
    `error_class` (nothing is stored); returns the payloads of every publish, in order."""
    topic = broker.service.topics[TOPIC]
    publish = topic.publish
    seen: list[bytes] = []

    def failing_publish(producer, data, **kwargs):
        payload = bytes(data)
        seen.append(payload)
        hit = [p for p in failing if payload.endswith(p)]
        if not hit:
            return publish(producer, data, **kwargs)
        failing.discard(hit[0])
        failed = asyncio.get_running_loop().create_future()
        failed.set_exception(error_class(f"injected {error_class.__name__}"))
        return failed

    monkeypatch.setattr(topic, "publish", failing_publish)
    return seen


def test_the_rejecting_codes_are_the_ones_tested():
    assert set(REJECTING) == _REJECTING
    assert not set(RETRIED) & _REJECTING


async def receive_all(consumer) -> list[bytes]:
    return [message.data for message in await drain(consumer, timeout=0.3)]


@pytest.mark.parametrize("code", list(RETRIED), ids=pb.ServerError.Name)
async def test_other_send_errors_resend_on_a_new_connection_and_store_once(broker, monkeypatch, code):
    async with Client(broker.url, operation_timeout_seconds=10) as client:
        consumer = await client.subscribe(TOPIC, "sub", initial_position="earliest")
        producer = await client.create_producer(TOPIC, producer_name="resender")
        partition = producer._partitions[0]
        first_connection = partition.connection
        seen = fail_publish(monkeypatch, broker, RETRIED[code], failing={b"once"})

        message_id = await asyncio.wait_for(producer.send(b"once"), 5)

        assert message_id.entry_id >= 0                              # stored, not a duplicate
        assert [p[-4:] for p in seen] == [b"once", b"once"]          # sent, failed, sent again
        assert partition.connection is not None and partition.connection is not first_connection
        assert first_connection.closed.done()                        # the old connection was dropped
        messages = await receive_all(consumer)
        assert messages == [b"once"]                                 # stored once
        assert await producer.send(b"after") is not None             # the producer goes on
        assert await receive_all(consumer) == [b"after"]


@pytest.mark.parametrize("code", list(REJECTING), ids=pb.ServerError.Name)
async def test_rejecting_send_errors_fail_that_send_only_and_keep_the_connection(broker, monkeypatch, code):
    async with Client(broker.url, operation_timeout_seconds=10) as client:
        consumer = await client.subscribe(TOPIC, "sub", initial_position="earliest")
        producer = await client.create_producer(TOPIC)
        partition = producer._partitions[0]
        connection = partition.connection
        error_class = REJECTING[code]
        seen = fail_publish(monkeypatch, broker, error_class, failing={b"m-1"})

        sends = [producer.send_async(b"m-%d" % i) for i in range(3)]
        results = await asyncio.wait_for(asyncio.gather(*sends, return_exceptions=True), 5)

        assert type(results[1]) is error_class                       # the class of the code, exactly
        assert results[1].server_error == code
        assert [r.entry_id >= 0 for r in (results[0], results[2])] == [True, True]
        assert len(seen) == 3                                        # nothing was sent again
        assert partition.connection is connection and not connection.closed.done()
        assert await receive_all(consumer) == [b"m-0", b"m-2"]
