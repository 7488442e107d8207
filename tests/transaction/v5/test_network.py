"""v5 over the wire: pyengine.client's scalable transactions on segment:// topics, next to v4
transactions on persistent:// topics, against one broker (the Pulsar binary protocol)."""

from __future__ import annotations

import pytest

from pyengine.client import Client
from pyengine.errors import InvalidTxnStatusError, NotAllowedError, TransactionConflictError
from pyengine.transaction.coordinator.metadata_records import V5_COORDINATOR_ID
from tests.client.conftest import broker, client  # noqa: F401  (fixtures)

SEGMENT = "segment://public/default/net/0000-ffff-0"
PERSISTENT = "persistent://public/default/net"


@pytest.fixture(autouse=True)
async def segment(broker):
    """SEGMENT, created as segments are: by its scalable topic (the wire creates none)."""
    await (await broker.service.scalable_topics()).create_topic("topic://public/default/net", 1)
    return SEGMENT


async def test_scalable_transactions_use_the_v5_coordinator(client, broker):
    producer = await client.create_producer(SEGMENT)
    watcher = await client.subscribe(SEGMENT, "watch", initial_position="earliest")
    txn = await client.new_transaction(scalable=True)
    assert txn.txn_id.most_bits == V5_COORDINATOR_ID
    for i in range(3):
        await producer.send(b"%d" % i, txn=txn)
    with pytest.raises(TimeoutError):
        await watcher.receive(timeout=0.2)
    await txn.commit()
    got = [int((await watcher.receive(timeout=5)).data) for _ in range(3)]
    assert got == [0, 1, 2]
    # consume-and-ack in a v5 txn, aborted: the message comes back
    consumer = await client.subscribe(SEGMENT, "work", consumer_type="shared", initial_position="earliest")
    message = await consumer.receive(timeout=5)
    undo = await client.new_transaction(scalable=True)
    await consumer.acknowledge(message, txn=undo)
    await undo.abort()
    await consumer.redeliver_unacknowledged_messages()
    seen = {(await consumer.receive(timeout=5)).data for _ in range(3)}
    assert message.data in seen
    with pytest.raises(InvalidTxnStatusError):
        await undo.commit()
    service = broker.service
    assert service.v5.coordinator.stats()["committed_total"] == 1
    assert service.v5.metrics.op_writes_total == 4


async def test_v4_and_v5_coexist_and_refuse_each_others_topics(client):
    v4_txn = await client.new_transaction()
    v5_txn = await client.new_transaction(scalable=True)
    assert v4_txn.txn_id.most_bits != V5_COORDINATOR_ID
    on_segment = await client.create_producer(SEGMENT)
    on_persistent = await client.create_producer(PERSISTENT)
    await on_persistent.send(b"v4", txn=v4_txn)
    await on_segment.send(b"v5", txn=v5_txn)
    # the reason, not the storage's ordering detail: a v4 send waits for its registration
    with pytest.raises(NotAllowedError, match="takes v5 .* only; .* is a v4 transaction"):
        await on_segment.send(b"v4-on-segment", txn=v4_txn)
    with pytest.raises((NotAllowedError, TransactionConflictError)):
        await on_persistent.send(b"v5-on-persistent", txn=v5_txn)
    await v4_txn.abort()
    await v5_txn.abort()


async def test_a_v4_acknowledgement_on_a_segment_is_refused_with_its_reason(client):
    await (await client.create_producer(SEGMENT)).send(b"plain")
    consumer = await client.subscribe(SEGMENT, "v4-acks", initial_position="earliest")
    message = await consumer.receive(timeout=5)
    v4_txn = await client.new_transaction()
    with pytest.raises(NotAllowedError, match="takes v5 .* only; .* is a v4 transaction"):
        await consumer.acknowledge(message, txn=v4_txn)
    await v4_txn.abort()
    await consumer.acknowledge(message)         # the message was not taken by the refused ack


async def test_malformed_scalable_transaction_requests(client):
    with pytest.raises(TypeError):
        await client.new_transaction(scalable="yes")
    with pytest.raises(ValueError):
        await client.new_transaction(timeout_ms=0, scalable=True)
