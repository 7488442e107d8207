"""Findings of the review of the broker's per-topic features (de-duplication, delayed
delivery, backlog quotas, expiry, inactive topics, compaction, schemas)."""

import asyncio

from pyengine.broker import Broker
from pyengine.transaction.buffer.topic_buffer import TopicTransactionBuffer
from tests.broker.helpers import drain

T = "persistent://public/default/topic-features-review"


async def test_a_dedup_policy_changed_while_the_topic_loads_applies_to_it(tmp_path, monkeypatch):
    """The de-duplication switch is read when the topic object is made, at the start of its
    load, and policy changes reach the loaded topics only: one changed while a topic was
    loading (its transaction buffer recovering) was never applied to it, so with de-duplication
    enabled by policy the topic stored every retried send again until the next policy change
    or reload."""
    gate = asyncio.Event()
    recover = TopicTransactionBuffer.recover

    async def slow_recover(self):
        await gate.wait()
        return await recover(self)

    async with Broker.embedded(tmp_path) as broker:
        service = broker.service
        monkeypatch.setattr(TopicTransactionBuffer, "recover", slow_recover)
        loading = asyncio.ensure_future(service.get_topic(T))
        await asyncio.sleep(0.05)
        await service.policies.set_topic_policy(T, "deduplicationEnabled", True)
        gate.set()
        await loading
        monkeypatch.setattr(TopicTransactionBuffer, "recover", recover)
        producer = await broker.create_producer(T, producer_name="app")
        await producer.send(b"first", sequence_id=0)
        await producer.send(b"retry", sequence_id=0)         # a retried send: stored once
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        assert [m.data for m in await drain(consumer)] == [b"first"]
