"""A consumer's unackedMessages in the subscription's stats and the admin topic stats, as
Apache Pulsar counts it: only on Shared and Key_Shared subscriptions (the broker's Consumer
counts unacked messages in individual-ack mode only); Exclusive and Failover consumers show 0,
however many delivered messages they hold unacknowledged."""

import pytest

from tests.admin.helpers import drain

TOPIC = "persistent://public/default/unacked-by-type"
TOPIC_URL = "/admin/v2/persistent/public/default/unacked-by-type"


@pytest.mark.parametrize("consumer_type, shown", [("exclusive", 0), ("failover", 0), ("shared", 3),
                                                  ("key_shared", 3)])
async def test_unacked_messages_are_shown_for_shared_and_key_shared_only(api, client, service,
                                                                         consumer_type, shown):
    consumer = await client.subscribe(TOPIC, "s", consumer_type=consumer_type, initial_position="earliest")
    producer = await client.create_producer(TOPIC)
    for i in range(3):
        await producer.send(b"m%d" % i, key="k")
    assert len(await drain(consumer)) == 3                     # delivered, none acknowledged
    subscription = service.topics[TOPIC].subscriptions["s"]
    assert [c.unacked_messages for c in subscription.consumers] == [3]   # still tracked inside
    assert [c["unackedMessages"] for c in subscription.stats()["consumers"]] == [shown]
    served = (await api.get(f"{TOPIC_URL}/stats")).body["subscriptions"]["s"]
    assert [c["unackedMessages"] for c in served["consumers"]] == [shown]
