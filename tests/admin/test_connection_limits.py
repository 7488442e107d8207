"""The producer and consumer limits at Pulsar's admin paths: maxProducersPerTopic,
maxConsumersPerTopic, maxConsumersPerSubscription of a namespace; maxProducers, maxConsumers,
maxConsumersPerSubscription of a topic (stored under Pulsar's TopicPolicies names)."""

import pytest

from pyengine.errors import ConsumerBusyError, ProducerBusyError

NS = "/admin/v2/namespaces/public/default"
TOPIC = "persistent://public/default/connections"
TOPIC_URL = "/admin/v2/persistent/public/default/connections"


@pytest.mark.parametrize("path", ["maxProducersPerTopic", "maxConsumersPerTopic", "maxConsumersPerSubscription"])
async def test_namespace_limit_set_read_and_removed(api, path):
    assert (await api.get(f"{NS}/{path}")).status == 204
    assert (await api.post(f"{NS}/{path}", 3)).status == 204
    assert (await api.get(f"{NS}/{path}")).body == 3
    assert (await api.delete(f"{NS}/{path}")).status == 204
    assert (await api.get(f"{NS}/{path}")).status == 204
    refused = await api.post(f"{NS}/{path}", -1)
    assert refused.status == 412 and refused.body["reason"] == f"{path} must be 0 or more"
    assert (await api.post(f"{NS}/{path}", raw='"3"')).status == 400


@pytest.mark.parametrize("path,namespace_path", [("maxProducers", "maxProducersPerTopic"),
                                                 ("maxConsumers", "maxConsumersPerTopic"),
                                                 ("maxConsumersPerSubscription", "maxConsumersPerSubscription")])
async def test_topic_limit_set_read_and_removed(api, client, path, namespace_path):
    await client.create_producer(TOPIC)
    assert (await api.get(f"{TOPIC_URL}/{path}")).status == 204
    assert (await api.get(f"{TOPIC_URL}/{path}?applied=true")).body == 0           # the broker's: none
    assert (await api.post(f"{NS}/{namespace_path}", 4)).status == 204
    assert (await api.get(f"{TOPIC_URL}/{path}?applied=true")).body == 4
    assert (await api.post(f"{TOPIC_URL}/{path}", 2)).status == 204
    assert (await api.get(f"{TOPIC_URL}/{path}")).body == 2
    assert (await api.get(f"{TOPIC_URL}/{path}?applied=true")).body == 2
    refused = await api.post(f"{TOPIC_URL}/{path}", -1)
    assert refused.status == 412 and refused.body["reason"] == f"{path} must be 0 or more"
    assert (await api.delete(f"{TOPIC_URL}/{path}")).status == 204
    assert (await api.get(f"{TOPIC_URL}/{path}?applied=true")).body == 4


async def test_limits_set_through_the_api_refuse_producers_and_consumers(api, client):
    await client.create_producer(TOPIC)
    assert (await api.post(f"{TOPIC_URL}/maxProducers", 1)).status == 204
    with pytest.raises(ProducerBusyError, match="max producers limit"):
        await client.create_producer(TOPIC)
    assert (await api.post(f"{TOPIC_URL}/maxConsumersPerSubscription", 1)).status == 204
    await client.subscribe(TOPIC, "s", consumer_type="shared")
    with pytest.raises(ConsumerBusyError, match="Subscription reached max consumers limit"):
        await client.subscribe(TOPIC, "s", consumer_type="shared")
    assert (await api.post(f"{TOPIC_URL}/maxConsumers", 1)).status == 204
    with pytest.raises(ConsumerBusyError, match="Topic reached max consumers limit"):
        await client.subscribe(TOPIC, "t", consumer_type="shared")
