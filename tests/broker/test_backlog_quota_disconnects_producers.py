"""Past a producer_request_hold / producer_exception backlog quota the periodic check closes the
producers connected (Pulsar's BacklogQuotaManager.disconnectProducers), not only new ones. An
embedded producer has no connection to reconnect: its next send attaches it again, refused as a
new producer is while the quota is exceeded. consumer_backlog_eviction leaves producers alone.
(The wire side, CLOSE_PRODUCER to the clients: tests/interop/test_backlog_quota_disconnects_producers.py.)"""

from __future__ import annotations

import pytest

from pyengine.broker import Broker
from pyengine.broker.backlog_quota import REFUSED
from pyengine.errors import ProducerBlockedQuotaExceededError, ProducerBlockedQuotaExceededException

from tests.broker.helpers import drain

T = "persistent://public/default/backlog-quota-disconnect"
PAYLOAD = b"x" * 100


async def _past_the_quota(broker):
    topic = await broker.service.get_topic(T)
    await topic.open_subscription("slow")
    producer = await broker.create_producer(T, send_timeout_ms=100)
    for _ in range(5):                               # 5 x 100 bytes and more: past 300
        await producer.send(PAYLOAD)
    return topic, producer


@pytest.mark.parametrize("policy, refusal", [("producer_request_hold", ProducerBlockedQuotaExceededError),
                                             ("producer_exception", ProducerBlockedQuotaExceededException)])
async def test_the_check_disconnects_a_connected_producer_until_the_backlog_is_consumed(tmp_path, policy, refusal):
    async with Broker.embedded(tmp_path, sync=False, backlog_quota_default_limit_bytes=300,
                               backlog_quota_default_retention_policy=policy) as broker:
        topic, producer = await _past_the_quota(broker)
        assert list(topic.producers) == [producer.producer_name]
        await broker.service.backlog_quotas.check_now()
        assert topic.producers == {}
        with pytest.raises(refusal, match=f"^{REFUSED}$"):
            await producer.send(PAYLOAD)
        assert topic.subscriptions["slow"].backlog() == 5        # the refused send was not stored
        consumer = await broker.subscribe(T, "slow")
        for message in await drain(consumer):
            await consumer.acknowledge(message)
        await producer.send(b"again")                            # attached again
        assert list(topic.producers) == [producer.producer_name]
        assert [m.data for m in await drain(consumer)] == [b"again"]


async def test_eviction_leaves_the_producers_connected(tmp_path):
    async with Broker.embedded(tmp_path, sync=False, backlog_quota_default_limit_bytes=300,
                               backlog_quota_default_retention_policy="consumer_backlog_eviction") as broker:
        topic, producer = await _past_the_quota(broker)
        await broker.service.backlog_quotas.check_now()
        assert list(topic.producers) == [producer.producer_name]
        await producer.send(PAYLOAD)
