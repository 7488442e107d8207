"""The producer's hot path: the hand-built SingleMessageMetadata of plain batched messages is
byte for byte what protobuf writes, and the client runs on uvloop (whose transports are not
asyncio.Transport subclasses) as well as on asyncio's loop."""

from __future__ import annotations

import uvloop
from hypothesis import given
from hypothesis import strategies as st

from pyengine.client import Client
from pyengine.client.batch import plain_single_metadata
from pyengine.protocol import pulsar_api_pb2 as pb
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
