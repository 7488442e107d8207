"""Inactive topic policies in the admin API, as Pulsar's: a topic's and a namespace's
InactiveTopicPolicies under `.../inactiveTopicPolicies` (GET, POST, DELETE; malformed bodies
400), in the namespace's policies, in /openapi.json, and the `pyengine admin` subcommands."""

from __future__ import annotations

import json

import pytest

from pyengine.cli import main

P = "/admin/v2/persistent/public/default"
NS = "/admin/v2/namespaces/public/default"
TOPIC = "persistent://public/default/idle"
POLICY = {"inactiveTopicDeleteMode": "delete_when_subscriptions_caught_up", "maxInactiveDurationSeconds": 600,
          "deleteWhileInactive": True}
DEFAULT = {"inactiveTopicDeleteMode": "delete_when_no_subscriptions", "maxInactiveDurationSeconds": 60,
           "deleteWhileInactive": True}


async def test_topic_policy_get_set_remove(api, client, service):
    producer = await client.create_producer(TOPIC)
    await producer.send(b"x")
    assert service.policies.inactive_topic_default.to_json() == DEFAULT     # the fixture's broker: Pulsar's
    assert (await api.get(f"{P}/idle/inactiveTopicPolicies")).status == 204
    assert (await api.get(f"{P}/idle/inactiveTopicPolicies?applied=true")).body == DEFAULT
    assert (await api.post(f"{P}/idle/inactiveTopicPolicies", POLICY)).status == 204
    assert (await api.get(f"{P}/idle/inactiveTopicPolicies")).body == POLICY
    assert service.policies.inactive_topic_policies(TOPIC).max_inactive_duration_seconds == 600
    assert (await api.post(f"{P}/idle/inactiveTopicPolicies", {"deleteWhileInactive": False})).status == 204
    assert (await api.get(f"{P}/idle/inactiveTopicPolicies")).body == {**DEFAULT, "deleteWhileInactive": False}
    assert (await api.delete(f"{P}/idle/inactiveTopicPolicies")).status == 204
    assert (await api.get(f"{P}/idle/inactiveTopicPolicies")).status == 204
    assert (await api.get(f"{P}/nope/inactiveTopicPolicies")).status == 404


async def test_namespace_policy_get_set_remove_and_the_topic_falls_back_on_it(api, client):
    producer = await client.create_producer(TOPIC)
    await producer.send(b"x")
    assert (await api.get(f"{NS}/inactiveTopicPolicies")).status == 204
    assert (await api.post(f"{NS}/inactiveTopicPolicies", POLICY)).status == 204
    assert (await api.get(f"{NS}/inactiveTopicPolicies")).body == POLICY
    assert (await api.get(NS)).body["inactive_topic_policies"] == POLICY
    assert (await api.get(f"{P}/idle/inactiveTopicPolicies?applied=true")).body == POLICY
    assert (await api.delete(f"{NS}/inactiveTopicPolicies")).status == 204
    assert (await api.get(f"{P}/idle/inactiveTopicPolicies?applied=true")).body == DEFAULT
    assert (await api.get("/admin/v2/namespaces/public/nope/inactiveTopicPolicies")).status == 404
    assert (await api.put("/admin/v2/namespaces/public/idle", {"inactive_topic_policies": POLICY})).status == 204
    assert (await api.get("/admin/v2/namespaces/public/idle/inactiveTopicPolicies")).body == POLICY


MALFORMED = [
    {"inactiveTopicDeleteMode": "delete_always"}, {"maxInactiveDurationSeconds": -1},
    {"maxInactiveDurationSeconds": 2**31}, {"maxInactiveDurationSeconds": "60"}, {"deleteWhileInactive": 1},
    {"deleteWhileInactive": True, "bogus": 1}, [1], 5, "x", None,
]


@pytest.mark.parametrize("body", MALFORMED, ids=repr)
async def test_malformed_bodies_are_400(api, client, body):
    producer = await client.create_producer(TOPIC)
    await producer.send(b"x")
    for path in (f"{P}/idle/inactiveTopicPolicies", f"{NS}/inactiveTopicPolicies"):
        reply = await api.post(path, raw=json.dumps(body))
        assert reply.status == 400, (path, reply)
        assert "reason" in reply.body
    assert (await api.put("/admin/v2/namespaces/public/idle2",
                          {"inactive_topic_policies": {"maxInactiveDurationSeconds": "1m"}})).status == 400
    assert (await api.get(f"{P}/idle/inactiveTopicPolicies")).status == 204
    assert (await api.get(f"{NS}/inactiveTopicPolicies")).status == 204


async def test_openapi_document(api):
    document = (await api.get("/openapi.json")).body
    for path in ("/admin/v2/persistent/{tenant}/{namespace}/{topic}/inactiveTopicPolicies",
                 "/admin/v2/namespaces/{tenant}/{namespace}/inactiveTopicPolicies"):
        assert set(document["paths"][path]) == {"get", "post", "delete"}
        body = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert set(body["properties"]) == set(DEFAULT)


async def test_cli(admin, client):
    producer = await client.create_producer(TOPIC)
    await producer.send(b"x")
    assert (await admin("namespaces", "set-inactive-topic-policies", "public/default", "-e", "-t", "10m",
                        "-m", "delete_when_subscriptions_caught_up"))[0] == 0
    assert (await admin("namespaces", "get-inactive-topic-policies", "public/default"))[1] == POLICY
    assert (await admin("topics", "set-inactive-topic-policies", TOPIC, "--disable-delete-while-inactive",
                        "--max-inactive-duration", "30", "--delete-mode", "delete_when_no_subscriptions"))[0] == 0
    assert (await admin("topics", "get-inactive-topic-policies", TOPIC))[1] == {
        **DEFAULT, "maxInactiveDurationSeconds": 30, "deleteWhileInactive": False}
    assert (await admin("topics", "remove-inactive-topic-policies", TOPIC))[0] == 0
    assert (await admin("topics", "get-inactive-topic-policies", TOPIC, "--applied"))[1] == POLICY
    assert (await admin("namespaces", "remove-inactive-topic-policies", "public/default"))[0] == 0
    assert (await admin("namespaces", "get-inactive-topic-policies", "public/default"))[1] is None


async def test_cli_needs_enable_or_disable(admin):
    for flags in ((), ("-e", "-d")):
        code, _, err = await admin("namespaces", "set-inactive-topic-policies", "public/default", *flags, "-t", "60",
                                   "-m", "delete_when_no_subscriptions")
        assert code != 0 and "--enable-delete-while-inactive" in err
    assert (await admin("namespaces", "get-inactive-topic-policies", "public/default"))[1] is None


@pytest.mark.parametrize("argv", [("-t", "soon", "-m", "delete_when_no_subscriptions"), ("-t", "60", "-m", "never"),
                                  ("-t", "60",)])
def test_cli_refuses_bad_arguments(argv):
    with pytest.raises(SystemExit):
        main(["admin", "namespaces", "set-inactive-topic-policies", "public/default", "-e", *argv])
