"""The unacked-messages limits of namespaces and topics at Pulsar's admin paths
(maxUnackedMessagesPerConsumer / PerSubscription of a namespace, maxUnackedMessagesOnConsumer /
OnSubscription of a topic): GET, POST, DELETE, malformed values refused as Pulsar refuses them,
and the consumer stats that show the limit at work."""

import pytest

from tests.admin.helpers import drain

NS = "/admin/v2/namespaces/public/default"
TOPIC = "persistent://public/default/limited"
TOPIC_URL = "/admin/v2/persistent/public/default/limited"


@pytest.mark.parametrize("path", ["maxUnackedMessagesPerConsumer", "maxUnackedMessagesPerSubscription"])
async def test_namespace_limit_set_read_and_removed(api, path):
    assert (await api.get(f"{NS}/{path}")).status == 204                   # not set
    assert (await api.post(f"{NS}/{path}", 7)).status == 204
    assert (await api.get(f"{NS}/{path}")).body == 7
    assert (await api.post(f"{NS}/{path}", 0)).status == 204                # 0: no limit
    assert (await api.get(f"{NS}/{path}")).body == 0
    assert (await api.delete(f"{NS}/{path}")).status == 204
    assert (await api.get(f"{NS}/{path}")).status == 204
    refused = await api.post(f"{NS}/{path}", -1)
    assert refused.status == 412 and refused.body["reason"] == f"{path} must be 0 or more"
    for malformed in ('"ten"', "1.5", "true", "", "2147483648"):
        assert (await api.post(f"{NS}/{path}", raw=malformed)).status == 400, malformed
    assert (await api.get(f"/admin/v2/namespaces/public/nope/{path}")).status == 404


@pytest.mark.parametrize("path", ["maxUnackedMessagesOnConsumer", "maxUnackedMessagesOnSubscription"])
async def test_topic_limit_set_read_and_removed(api, client, path):
    assert (await api.post(f"{TOPIC_URL}/{path}", 5)).status == 404         # no such topic yet
    await client.create_producer(TOPIC)
    assert (await api.get(f"{TOPIC_URL}/{path}")).status == 204
    default = 50000 if path.endswith("Consumer") else 200000
    assert (await api.get(f"{TOPIC_URL}/{path}?applied=true")).body == default
    assert (await api.post(f"{NS}/{path.replace('On', 'Per')}", 9)).status == 204
    assert (await api.get(f"{TOPIC_URL}/{path}?applied=true")).body == 9   # the namespace's
    assert (await api.post(f"{TOPIC_URL}/{path}", 5)).status == 204
    assert (await api.get(f"{TOPIC_URL}/{path}")).body == 5
    assert (await api.get(f"{TOPIC_URL}/{path}?applied=true")).body == 5
    refused = await api.post(f"{TOPIC_URL}/{path}", -2)
    assert refused.status == 412 and refused.body["reason"] == "maxUnackedNum must be 0 or more"
    assert (await api.post(f"{TOPIC_URL}/{path}", raw='"5"')).status == 400
    assert (await api.delete(f"{TOPIC_URL}/{path}")).status == 204
    assert (await api.get(f"{TOPIC_URL}/{path}?applied=true")).body == 9


async def test_a_topic_limit_set_through_the_api_applies_to_a_consumer_already_there(api, client, service):
    producer = await client.create_producer(TOPIC)
    for i in range(20):
        await producer.send(b"m%d" % i)
    assert (await api.post(f"{TOPIC_URL}/maxUnackedMessagesOnConsumer", 4)).status == 204
    consumer = await client.subscribe(TOPIC, "s", consumer_type="shared", initial_position="earliest")
    got = await drain(consumer)
    assert len(got) == 4
    stats = service.topics[TOPIC].subscriptions["s"].stats()["consumers"][0]
    assert stats["unackedMessages"] == 4 and stats["blockedConsumerOnUnackedMsgs"] is True
    served = (await api.get(f"{TOPIC_URL}/stats")).body["subscriptions"]["s"]        # the same over REST
    assert served["blockedSubscriptionOnUnackedMsgs"] is False
    assert [(c["unackedMessages"], c["blockedConsumerOnUnackedMsgs"]) for c in served["consumers"]] == [(4, True)]
    assert (await api.post(f"{TOPIC_URL}/maxUnackedMessagesOnConsumer", 0)).status == 204    # lifted
    assert len(await drain(consumer)) == 16
