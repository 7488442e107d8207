"""A topic keeps the transaction design (PIP-31 v4 or PIP-473 v5) of its first load when its
namespace's transactionVersion changes: v4 markers and snapshots and v5 metadata records are
each read by their own design only. Found by an audit: switched to v5 and reloaded, a
persistent:// topic showed the messages of its aborted and still-open v4 transactions. The new
version applies to the topics first loaded after the change."""

from __future__ import annotations

import dataclasses

from pyengine.broker import Broker
from pyengine.broker.policies import NamespacePolicies
from pyengine.transaction.buffer.metadata_buffer import MetadataTransactionBuffer
from pyengine.transaction.buffer.topic_buffer import TopicTransactionBuffer
from tests.broker.helpers import drain
from tests.spark.workload import read_directly

NAMESPACE = "public/switching"
TOPIC = f"persistent://{NAMESPACE}/t"


async def test_a_topic_keeps_its_design_when_its_namespace_switches(tmp_path):
    async with Broker.embedded(tmp_path, sync=False) as broker:
        await broker.service.policies.create_namespace(NAMESPACE)
        producer = await broker.create_producer(TOPIC)
        await broker.subscribe(TOPIC, "s", initial_position="earliest")
        aborted, left_open = await broker.new_transaction(), await broker.new_transaction(timeout_ms=600_000)
        await producer.send(b"aborted", txn=aborted)
        await aborted.abort()
        await producer.send(b"plain")
        await producer.send(b"open", txn=left_open)
        policies = broker.service.policies.policies(NAMESPACE)
        await broker.service.policies.set_policies(NAMESPACE, dataclasses.replace(policies, transaction_version=5))
    async with Broker.embedded(tmp_path, sync=False) as broker:
        consumer = await broker.subscribe(TOPIC, "s", initial_position="earliest")
        assert type(broker.service.topics[TOPIC].buffer) is TopicTransactionBuffer
        assert [m.data for m in await drain(consumer, timeout=0.5)] == [b"plain"]
        await broker.create_producer(f"persistent://{NAMESPACE}/new")      # first loaded now: v5
        assert type(broker.service.topics[f"persistent://{NAMESPACE}/new"].buffer) is MetadataTransactionBuffer
    # Spark's READ_COMMITTED source decides as the broker does
    assert [row["value"] for row in read_directly(tmp_path, topics=TOPIC).to_pylist()] == [b"plain"]
