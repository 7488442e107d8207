"""The message size limit is one limit, the same on both sides: the broker announces
`max_message_size` in CONNECTED, the client refuses larger payloads locally, and the broker
stores every payload up to that size (its frames carry metadata and a checksum on top, which
the frame limit's padding covers, as Apache's broker does)."""

import pytest

from pyengine.client import MessageTooBigError

from .conftest import drain

TOPIC = "persistent://public/default/size-limit"


async def test_a_payload_of_exactly_the_announced_limit_is_stored_and_delivered(broker, client):
    producer = await client.create_producer(TOPIC)
    consumer = await client.subscribe(TOPIC, "sub", initial_position="earliest")
    limit = broker.server.max_message_size
    payload = b"x" * limit
    message_id = await producer.send(payload, key="k", properties={"p": "v"})
    assert message_id.entry_id >= 0
    with pytest.raises(MessageTooBigError):
        await producer.send(payload + b"x")
    got = await drain(consumer)
    assert [len(m.data) for m in got] == [limit]
