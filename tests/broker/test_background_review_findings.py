"""Review findings on the broker's background features (backlog quotas, message expiry,
inactive topics, compaction, delayed delivery) and their interplay with v4 transactions."""

from __future__ import annotations

from pyengine.broker import Broker
from pyengine.broker.backlog_quota import backlog_size
from pyengine.broker.policies import BacklogQuota
from tests.broker.helpers import drain
from tests.broker.test_backlog_quota import PAYLOAD, T, _fill, _set_namespace_quota


async def test_size_eviction_behind_an_open_transaction_skips_only_the_share_over_the_target(tmp_path):
    """The size measured stops at the read horizon (an open transaction's first entry), but
    the share to skip was taken of the subscription's whole backlog, up to the LAC: with many
    entries queued behind the transaction, the eviction skipped every readable entry when
    one or two were over the target."""
    async with Broker.embedded(tmp_path, sync=False) as broker:
        producer = await _fill(broker, 10)
        topic = broker.service.topics[T]
        txn = await broker.new_transaction()
        await producer.send(b"in-txn", txn=txn)
        for _ in range(100):
            await producer.send(PAYLOAD)                   # queued behind the transaction
        readable = backlog_size(topic)                     # the 10 before it (estimated)
        # Just under the 10 readable entries: skipping 2 of them brings it under 90%.
        await _set_namespace_quota(broker, "destination_storage",
                                   BacklogQuota(readable - 10, policy="consumer_backlog_eviction"))
        await broker.service.backlog_quotas.check_now()
        assert backlog_size(topic) <= 0.9 * (readable - 10)
        slow = topic.subscriptions["slow"]
        assert topic.ledger.entries_between(slow.cursor.mark_delete, topic.buffer.max_read_position()) == 8
        await txn.commit()
        consumer = await broker.subscribe(T, "slow")
        assert len(await drain(consumer)) == 8 + 1 + 100
