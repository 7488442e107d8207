"""Stopping a running compaction (`TopicCompaction.close`) when whoever stops it is itself
cancelled: that cancellation is the caller's, not the compaction's."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.broker import Broker
from pyengine.broker.compaction import COMPACTED_TOPIC_LEDGER_PROPERTY, COMPACTION_SUBSCRIPTION
from tests.broker.helpers import GatedWriter
from tests.broker.test_compaction import TOPIC


async def _compaction_in_its_switch(broker):
    """A compaction held in its switch (its cursor move and view written together, the
    group commit held): the topic, the compaction's task, the gate and the last message id."""
    producer = await broker.create_producer(TOPIC)
    last = None
    for i in range(6):
        last = await producer.send(f"v{i}".encode(), key=f"k{i % 3}")
    topic = await broker.service.get_topic(TOPIC)
    gate = GatedWriter(topic.ledger.env)
    task = topic.compaction.trigger()
    while True:
        await gate.next_commit()
        subscription = topic.subscriptions.get(COMPACTION_SUBSCRIPTION)
        if subscription is not None and COMPACTED_TOPIC_LEDGER_PROPERTY in subscription.cursor.properties:
            return topic, task, gate, last.position
        gate.let_through()


async def test_a_cancelled_unsubscribe_of_the_compaction_subscription_is_cancelled(tmp_path):
    """Deleting `__compaction` stops the compaction first; cancelled while it waits for the
    compaction's last write, the deletion is cancelled (the subscription stays), and the
    compaction is not cancelled a second time: its switch, written, is taken up in memory
    (a second cancellation put the old horizon back in memory over the new one on disk)."""
    async with Broker.embedded(tmp_path, sync=False) as broker:
        topic, task, gate, last = await _compaction_in_its_switch(broker)
        try:
            deleting = asyncio.create_task(topic.unsubscribe(COMPACTION_SUBSCRIPTION, force=True))
            while not task.cancelling():
                await asyncio.sleep(0)          # the deletion has cancelled the compaction
            await asyncio.sleep(0)
            deleting.cancel()
            await asyncio.sleep(0)
            gate.open()
            await asyncio.wait([deleting, task])
        finally:
            gate.open()
        assert deleting.cancelled()
        assert COMPACTION_SUBSCRIPTION in topic.subscriptions
        assert topic.compaction.horizon == last
        assert [e.position for e in topic.compaction.iter_view()][-1] == last
