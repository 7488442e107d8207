"""Auto subscription creation in the admin API, as Pulsar's: a namespace's and a topic's
AutoSubscriptionCreationOverride under `.../autoSubscriptionCreation` (GET, POST, DELETE;
malformed bodies 400), in the namespace's policies, the embedded client refused as the wire
refuses, the `pyengine admin` subcommands and the `pyengine serve` flag."""

from __future__ import annotations

import json

import pytest

from pyengine.broker.embedded import EmbeddedClient
from pyengine.cli.serve import broker_config
from pyengine.client.message import MessageId
from pyengine.errors import NotAllowedError, SubscriptionNotFoundError
from tests.cli.serve_flags import serve_args

NS = "/admin/v2/namespaces/public/default"
P = "/admin/v2/persistent/public/default"
TOPIC = "persistent://public/default/subs"
OFF = {"allowAutoSubscriptionCreation": False}
ON = {"allowAutoSubscriptionCreation": True}


async def test_namespace_and_topic_overrides_get_set_remove(api, service):
    await service.get_topic(TOPIC)
    assert (await api.get(f"{NS}/autoSubscriptionCreation")).status == 204
    assert (await api.post(f"{NS}/autoSubscriptionCreation", OFF)).status == 204
    assert (await api.get(f"{NS}/autoSubscriptionCreation")).body == OFF
    assert (await api.get(NS)).body["autoSubscriptionCreationOverride"] == OFF
    assert (await api.get(f"{P}/subs/autoSubscriptionCreation")).status == 204
    assert (await api.get(f"{P}/subs/autoSubscriptionCreation?applied=true")).body == OFF
    assert (await api.post(f"{P}/subs/autoSubscriptionCreation", ON)).status == 204
    assert (await api.get(f"{P}/subs/autoSubscriptionCreation")).body == ON
    assert service.policies.auto_subscription_creation(TOPIC)
    assert (await api.delete(f"{P}/subs/autoSubscriptionCreation")).status == 204
    assert not service.policies.auto_subscription_creation(TOPIC)
    assert (await api.delete(f"{NS}/autoSubscriptionCreation")).status == 204
    assert service.policies.auto_subscription_creation(TOPIC)
    assert (await api.get(f"{P}/nope/autoSubscriptionCreation")).status == 404
    assert (await api.get("/admin/v2/namespaces/public/nope/autoSubscriptionCreation")).status == 404
    assert (await api.put("/admin/v2/namespaces/public/made", {"autoSubscriptionCreationOverride": OFF})).status == 204
    assert (await api.get("/admin/v2/namespaces/public/made/autoSubscriptionCreation")).body == OFF


MALFORMED = [{}, {"allowAutoSubscriptionCreation": "false"}, {"allowAutoSubscriptionCreation": 0},
             {"allowAutoSubscriptionCreation": None}, {**ON, "extra": 1}, [True], True, "x", None]


@pytest.mark.parametrize("body", MALFORMED, ids=repr)
async def test_malformed_bodies_are_400(api, service, body):
    await service.get_topic(TOPIC)
    for path in (f"{NS}/autoSubscriptionCreation", f"{P}/subs/autoSubscriptionCreation"):
        reply = await api.post(path, raw=json.dumps(body))
        assert reply.status == 400, (path, reply)
        assert (await api.get(path)).status == 204
    created = await api.put("/admin/v2/namespaces/public/made", {"autoSubscriptionCreationOverride": body})
    assert created.status == 400 or body is None


async def test_the_embedded_client_is_refused_as_on_the_wire(api, service):
    topic = await service.get_topic(TOPIC)
    await topic.open_subscription("existing", "earliest")
    assert (await api.post(f"{NS}/autoSubscriptionCreation", OFF)).status == 204
    client = EmbeddedClient(service)
    try:
        with pytest.raises(SubscriptionNotFoundError):
            await client.subscribe(TOPIC, "new-sub")
        with pytest.raises(NotAllowedError, match="auto subscription creation is not allowed"):
            await client.create_producer(TOPIC, initial_subscription_name="init")
        assert set(topic.subscriptions) == {"existing"} and not topic.producers
        consumer = await client.subscribe(TOPIC, "existing")
        await consumer.close()
        reader = await client.create_reader(TOPIC, MessageId.earliest)
        await reader.close()
    finally:
        await client.close()


async def test_openapi_document(api):
    document = (await api.get("/openapi.json")).body
    for path in ("/admin/v2/namespaces/{tenant}/{namespace}/autoSubscriptionCreation",
                 "/admin/v2/persistent/{tenant}/{namespace}/{topic}/autoSubscriptionCreation"):
        assert set(document["paths"][path]) == {"get", "post", "delete"}


async def test_cli(admin, service):
    await service.get_topic(TOPIC)
    assert (await admin("namespaces", "set-auto-subscription-creation", "public/default"))[0] == 0
    assert (await admin("namespaces", "get-auto-subscription-creation", "public/default"))[1] == OFF
    assert (await admin("topics", "set-auto-subscription-creation", TOPIC, "-e"))[0] == 0
    assert (await admin("topics", "get-auto-subscription-creation", TOPIC))[1] == ON
    assert (await admin("topics", "remove-auto-subscription-creation", TOPIC))[0] == 0
    assert (await admin("topics", "get-auto-subscription-creation", TOPIC, "--applied"))[1] == OFF
    assert (await admin("namespaces", "remove-auto-subscription-creation", "public/default"))[0] == 0
    assert (await admin("namespaces", "get-auto-subscription-creation", "public/default"))[1] is None


def test_serve_flag_sets_the_brokers_default(tmp_path):
    assert broker_config(serve_args("--data-dir", str(tmp_path))).allow_auto_subscription_creation
    config = broker_config(serve_args("--data-dir", str(tmp_path), "--no-auto-subscription-creation"))
    assert config.allow_auto_subscription_creation is False
