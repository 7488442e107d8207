"""Delayed delivery in the admin API, as Pulsar's: `msgDelayed` in subscription stats (summed
in partitioned stats), the DelayedDeliveryPolicies of a topic and of a namespace under
`.../delayedDelivery` (GET, POST, DELETE; malformed bodies 400), in /openapi.json, and the
`pyengine admin` subcommands."""

from __future__ import annotations

import datetime
import json

import pytest

from pyengine.cli import main
from pyengine.cli.admin import delay_ms

P = "/admin/v2/persistent/public/default"
NS = "/admin/v2/namespaces/public/default"
TOPIC = "persistent://public/default/dd"
POLICY = {"active": True, "tickTime": 500, "maxDeliveryDelayInMillis": 60_000}
DEFAULT = {"active": True, "tickTime": 1000, "maxDeliveryDelayInMillis": 0}


async def test_topic_policy_get_set_remove(api, client):
    producer = await client.create_producer(TOPIC)
    await producer.send(b"x")
    assert (await api.get(f"{P}/dd/delayedDelivery")).status == 204
    assert (await api.get(f"{P}/dd/delayedDelivery?applied=true")).body == DEFAULT
    assert (await api.post(f"{P}/dd/delayedDelivery", POLICY)).status == 204
    assert (await api.get(f"{P}/dd/delayedDelivery")).body == POLICY
    assert (await api.get(f"{P}/dd/delayedDelivery?applied=true")).body == POLICY
    # a missing field is its default
    assert (await api.post(f"{P}/dd/delayedDelivery", {"active": False})).status == 204
    assert (await api.get(f"{P}/dd/delayedDelivery")).body == {**DEFAULT, "active": False}
    assert (await api.delete(f"{P}/dd/delayedDelivery")).status == 204
    assert (await api.get(f"{P}/dd/delayedDelivery")).status == 204
    assert (await api.get(f"{P}/nope/delayedDelivery")).status == 404
    assert (await api.post(f"{P}/nope/delayedDelivery", POLICY)).status == 404


async def test_namespace_policy_get_set_remove_and_the_topic_falls_back_on_it(api, client, service):
    producer = await client.create_producer(TOPIC)
    await producer.send(b"x")
    assert (await api.get(f"{NS}/delayedDelivery")).status == 204
    assert (await api.post(f"{NS}/delayedDelivery", POLICY)).status == 204
    assert (await api.get(f"{NS}/delayedDelivery")).body == POLICY
    assert (await api.get(NS)).body["delayed_delivery_policies"] == POLICY
    assert (await api.get(f"{P}/dd/delayedDelivery?applied=true")).body == POLICY
    assert service.policies.delayed_delivery(TOPIC).max_delivery_delay_ms == 60_000
    assert (await api.delete(f"{NS}/delayedDelivery")).status == 204
    assert (await api.get(f"{NS}/delayedDelivery")).status == 204
    assert (await api.get(f"{P}/dd/delayedDelivery?applied=true")).body == DEFAULT
    assert (await api.get("/admin/v2/namespaces/public/nope/delayedDelivery")).status == 404
    # created with the policy
    assert (await api.put("/admin/v2/namespaces/public/dd", {"delayed_delivery_policies": POLICY})).status == 204
    assert (await api.get("/admin/v2/namespaces/public/dd/delayedDelivery")).body == POLICY


MALFORMED = [
    {"active": "yes"}, {"tickTime": -1}, {"tickTime": 1.5}, {"maxDeliveryDelayInMillis": -5},
    {"maxDeliveryDelayInMillis": True}, {"tickTime": 2**63}, {"active": True, "bogus": 1}, [1], 5, "x", None,
]


@pytest.mark.parametrize("body", MALFORMED, ids=repr)
async def test_malformed_bodies_are_400(api, client, body):
    producer = await client.create_producer(TOPIC)
    await producer.send(b"x")
    for path in (f"{P}/dd/delayedDelivery", f"{NS}/delayedDelivery"):
        reply = await api.post(path, raw=json.dumps(body))
        assert reply.status == 400, (path, reply)
        assert "reason" in reply.body
    assert (await api.post(f"{NS}/delayedDelivery", raw="{not json")).status == 400
    assert (await api.put("/admin/v2/namespaces/public/dd2",
                          {"delayed_delivery_policies": {"tickTime": "1s"}})).status == 400
    assert (await api.get(f"{P}/dd/delayedDelivery")).status == 204
    assert (await api.get(f"{NS}/delayedDelivery")).status == 204


async def test_msg_delayed_in_stats_and_partitioned_stats(api, client, service):
    await api.put(f"{P}/pdd/partitions", 2)
    for name in ("dd", "pdd-partition-0", "pdd-partition-1"):
        topic = f"persistent://public/default/{name}"
        consumer = await client.subscribe(topic, "s", consumer_type="shared", initial_position="earliest")
        exclusive = await client.subscribe(topic, "x", consumer_type="exclusive", initial_position="earliest")
        producer = await client.create_producer(topic)
        await producer.send(b"later", deliver_after=datetime.timedelta(minutes=10))
        await producer.send(b"now")
        assert (await consumer.receive(timeout=2)).data == b"now"
        assert (await exclusive.receive(timeout=2)).data == b"later"      # Exclusive does not delay
    stats = (await api.get(f"{P}/dd/stats")).body
    assert stats["subscriptions"]["s"]["msgDelayed"] == 1
    assert stats["subscriptions"]["x"]["msgDelayed"] == 0
    partitioned = (await api.get(f"{P}/pdd/partitioned-stats")).body
    assert partitioned["subscriptions"]["s"]["msgDelayed"] == 2
    assert partitioned["subscriptions"]["x"]["msgDelayed"] == 0
    assert partitioned["partitions"][f"persistent://public/default/pdd-partition-1"]["subscriptions"]["s"][
        "msgDelayed"] == 1


async def test_openapi_document(api):
    document = (await api.get("/openapi.json")).body
    for path in ("/admin/v2/persistent/{tenant}/{namespace}/{topic}/delayedDelivery",
                 "/admin/v2/namespaces/{tenant}/{namespace}/delayedDelivery"):
        assert set(document["paths"][path]) == {"get", "post", "delete"}
        body = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert set(body["properties"]) == {"active", "tickTime", "maxDeliveryDelayInMillis"}
    stats = document["paths"]["/admin/v2/persistent/{tenant}/{namespace}/{topic}/stats"]["get"]
    sub = stats["responses"]["200"]["content"]["application/json"]["schema"]["properties"]["subscriptions"]
    assert "msgDelayed" in sub["additionalProperties"]["properties"]


async def test_cli(admin, client):
    producer = await client.create_producer(TOPIC)
    await producer.send(b"x")
    assert (await admin("namespaces", "set-delayed-delivery", "public/default", "--enable", "--time", "2s",
                        "--maxDelay", "1h"))[0] == 0
    assert (await admin("namespaces", "get-delayed-delivery", "public/default"))[1] == {
        "active": True, "tickTime": 2000, "maxDeliveryDelayInMillis": 3_600_000}
    assert (await admin("topics", "set-delayed-delivery", TOPIC, "-t", "500ms"))[0] == 0
    assert (await admin("topics", "get-delayed-delivery", TOPIC))[1] == {
        "active": False, "tickTime": 500, "maxDeliveryDelayInMillis": 0}
    assert (await admin("topics", "remove-delayed-delivery", TOPIC))[0] == 0
    assert (await admin("topics", "get-delayed-delivery", TOPIC, "--applied"))[1] == {
        "active": True, "tickTime": 2000, "maxDeliveryDelayInMillis": 3_600_000}
    assert (await admin("namespaces", "remove-delayed-delivery", "public/default"))[0] == 0
    assert (await admin("namespaces", "get-delayed-delivery", "public/default"))[1] is None


def test_cli_durations():
    assert delay_ms("1s") == delay_ms("1") == 1000
    assert delay_ms("250ms") == 250
    assert delay_ms("2m") == 120_000 and delay_ms("1w") == 7 * 86_400_000
    for bad in ("", "-1s", "1.5s", "1y", "s", "10 s"):
        with pytest.raises(Exception):
            delay_ms(bad)
    with pytest.raises(SystemExit):
        main(["admin", "topics", "set-delayed-delivery", TOPIC, "--time", "soon"])
