"""The producer's hot path: the hand-built SingleMessageMetadata of plain batched messages is
byte for byte what protobuf writes, and the client runs on uvloop (whose transports are not
asyncio.Transport subclasses) as well as on asyncio's loop."""

from __future__ import annotations

import pytest
import uvloop
from hypothesis import given
from hypothesis import strategies as st

from pyengine.client import Client
from pyengine.client.batch import plain_single_metadata
from pyengine.errors import PulsarError
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine_kernels import TxnId
from tests.client.conftest import NetworkBroker


@given(st.integers(0, 2**31 - 1), st.integers(0, 2**64 - 1))
def test_plain_single_metadata_is_what_protobuf_writes(payload_size, sequence_id):
    expected = pb.SingleMessageMetadata(payload_size=payload_size, sequence_id=sequence_id).SerializeToString()
    assert plain_single_metadata(payload_size, sequence_id) == expected
    parsed = pb.SingleMessageMetadata.FromString(plain_single_metadata(payload_size, sequence_id))
    assert (parsed.payload_size, parsed.sequence_id) == (payload_size, sequence_id)


def test_batched_plain_and_keyed_messages_on_uvloop(tmp_path):
    async def scenario() -> list[tuple[bytes, str | None, dict[str, str]]]:
        broker = NetworkBroker(tmp_path / "data", num_coordinators=1)
        await broker.start()
        try:
            async with Client(broker.url, operation_timeout_seconds=10) as client:
                topic = "persistent://public/default/uvloop-batches"
                consumer = await client.subscribe(topic, "s", initial_position="earliest")
                producer = await client.create_producer(topic, batching_enabled=True, batching_max_messages=4)
                futures = [producer.send_async(b"plain-%d" % i) for i in range(5)]
                futures.append(producer.send_async(b"keyed", key="k", properties={"p": "v"}))
                futures.append(producer.send_async(b"plain-last"))
                await producer.flush()
                ids = [f.result() for f in futures]
                assert len(set(ids)) == len(ids)
                received = []
                for _ in futures:
                    message = await consumer.receive(timeout=10)
                    received.append((message.data, message.partition_key, message.properties))
                    await consumer.acknowledge(message)
                return received
        finally:
            await broker.stop()

    received = uvloop.run(scenario())
    assert received == [(b"plain-%d" % i, None, {}) for i in range(5)] + \
        [(b"keyed", "k", {"p": "v"}), (b"plain-last", None, {})]


async def test_a_commit_right_after_send_async_waits_for_those_sends(client):
    """send_async(txn=) belongs to the transaction from the call on: commit without awaiting
    the futures still commits every message, in send order, with plain sends in between."""
    topic = "persistent://public/default/send-async-then-commit"
    consumer = await client.subscribe(topic, "s", initial_position="earliest")
    producer = await client.create_producer(topic, batching_enabled=True, max_pending_messages=8)
    txn = await client.new_transaction()
    futures = [producer.send_async(b"t%d" % i, txn=txn) for i in range(30)]   # more than the queue holds
    await txn.commit()
    assert all(f.done() and f.exception() is None for f in futures)
    ids = [f.result() for f in futures]
    assert ids == sorted(ids)
    received = [(await consumer.receive(timeout=10)).data for _ in futures]
    assert received == [b"t%d" % i for i in range(30)]


async def test_sends_of_a_failed_registration_fail_and_the_commit_aborts(client, broker):
    topic = "persistent://public/default/send-async-failed-registration"
    producer = await client.create_producer(topic, batching_enabled=True)
    txn = await client.new_transaction(timeout_ms=60_000)
    # An unknown transaction id: the coordinator refuses ADD_PARTITION_TO_TXN.
    txn.txn_id = TxnId(txn.txn_id.most_bits, txn.txn_id.least_bits + 1_000_000)
    futures = [producer.send_async(b"x", txn=txn) for _ in range(3)]
    with pytest.raises(PulsarError):
        await txn.commit()
    assert all(isinstance(f.exception(), PulsarError) for f in futures)
    assert await producer.send(b"plain") is not None          # the producer goes on
