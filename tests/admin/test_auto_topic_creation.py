"""Auto topic creation in the admin API, as Pulsar's: a namespace's AutoTopicCreationOverride
under `.../autoTopicCreation` (GET, POST, DELETE; 412 with Pulsar's reasons, 406 for too many
partitions, 400 for malformed bodies), in the namespace's policies, `checkAllowAutoCreation` on
a topic's partitioned metadata, the `pyengine admin` subcommands and `pyengine serve` flags."""

from __future__ import annotations

import dataclasses
import json

import pytest

from pyengine.broker.embedded import EmbeddedClient
from pyengine.cli import main
from pyengine.cli.serve import broker_config
from pyengine.errors import TopicNotFoundError
from pyengine.naming import TopicName
from tests.cli.serve_flags import serve_args

NS = "/admin/v2/namespaces/public/default"
P = "/admin/v2/persistent/public/default"
PARTITIONED = {"allowAutoTopicCreation": True, "topicType": "partitioned", "defaultNumPartitions": 4}
OFF = {"allowAutoTopicCreation": False, "topicType": None, "defaultNumPartitions": None}


async def test_namespace_override_get_set_remove(api, service):
    assert (await api.get(f"{NS}/autoTopicCreation")).status == 204
    assert (await api.post(f"{NS}/autoTopicCreation", PARTITIONED)).status == 204
    assert (await api.get(f"{NS}/autoTopicCreation")).body == PARTITIONED
    assert (await api.get(NS)).body["autoTopicCreationOverride"] == PARTITIONED
    assert service.policies.auto_topic_creation("public/default").partitions == 4
    assert (await api.post(f"{NS}/autoTopicCreation", {"allowAutoTopicCreation": False})).status == 204
    assert (await api.get(f"{NS}/autoTopicCreation")).body == OFF
    assert not service.auto_creates(TopicName.parse("persistent://public/default/t"))
    assert (await api.delete(f"{NS}/autoTopicCreation")).status == 204
    assert (await api.get(f"{NS}/autoTopicCreation")).status == 204
    assert service.auto_creates(TopicName.parse("persistent://public/default/t"))
    assert (await api.get("/admin/v2/namespaces/public/nope/autoTopicCreation")).status == 404
    assert (await api.post("/admin/v2/namespaces/public/nope/autoTopicCreation", PARTITIONED)).status == 404
    assert (await api.put("/admin/v2/namespaces/public/made", {"autoTopicCreationOverride": PARTITIONED})).status == 204
    assert (await api.get("/admin/v2/namespaces/public/made/autoTopicCreation")).body == PARTITIONED


# Pulsar's validateOverride: checked only when creation is allowed.
INVALID = [
    ({"allowAutoTopicCreation": True, "topicType": "sharded"}, "Unknown topic type [sharded]"),
    ({"allowAutoTopicCreation": True}, "Unknown topic type [None]"),
    ({"allowAutoTopicCreation": True, "topicType": "partitioned"}, "cannot be null when the type is partitioned"),
    ({"allowAutoTopicCreation": True, "topicType": "partitioned", "defaultNumPartitions": 0}, "cannot be less than 1"),
    ({"allowAutoTopicCreation": True, "topicType": "non-partitioned", "defaultNumPartitions": 2},
     "is not allowed to be set when the type is non-partition"),
]


@pytest.mark.parametrize(("body", "reason"), INVALID, ids=repr)
async def test_an_invalid_override_is_412_with_pulsars_reason(api, body, reason):
    reply = await api.post(f"{NS}/autoTopicCreation", body)
    assert reply.status == 412, reply
    assert reason in reply.body["reason"]
    assert (await api.get(f"{NS}/autoTopicCreation")).status == 204
    created = await api.put("/admin/v2/namespaces/public/made", {"autoTopicCreationOverride": body})
    assert created.status == 412 and (await api.get("/admin/v2/namespaces/public/made")).status == 404


async def test_more_partitions_than_a_topic_may_have_is_406(api):
    reply = await api.post(f"{NS}/autoTopicCreation", {**PARTITIONED, "defaultNumPartitions": 10_001})
    assert reply.status == 406 and "less than or equal to 10000" in reply.body["reason"]
    assert (await api.get(f"{NS}/autoTopicCreation")).status == 204


MALFORMED = [{}, {"allowAutoTopicCreation": "yes"}, {"allowAutoTopicCreation": 1},
             {"allowAutoTopicCreation": True, "topicType": 3},
             {**PARTITIONED, "defaultNumPartitions": "4"}, {**PARTITIONED, "defaultNumPartitions": 2.5},
             {**PARTITIONED, "defaultNumPartitions": 2**31}, {**PARTITIONED, "bogus": 1}, [1], 5, "x", None]


@pytest.mark.parametrize("body", MALFORMED, ids=repr)
async def test_malformed_bodies_are_400(api, body):
    reply = await api.post(f"{NS}/autoTopicCreation", raw=json.dumps(body))
    assert reply.status == 400, reply
    assert "reason" in reply.body
    assert (await api.get(f"{NS}/autoTopicCreation")).status == 204


async def test_check_allow_auto_creation_answers_as_a_clients_lookup(api, service):
    url = f"{P}/fresh/partitions?checkAllowAutoCreation=true"
    assert (await api.get(f"{P}/fresh/partitions")).status == 404        # without the flag: 404, nothing made
    assert (await api.get(url)).body == {"partitions": 0}               # made non-partitioned on first use
    assert not service.topic_exists("persistent://public/default/fresh")
    assert (await api.post(f"{NS}/autoTopicCreation", PARTITIONED)).status == 204
    assert (await api.get(url)).body == {"partitions": 4}               # made partitioned now
    assert (await api.get(f"{P}/fresh/partitions")).body == {"partitions": 4}
    assert (await api.post(f"{NS}/autoTopicCreation", {"allowAutoTopicCreation": False})).status == 204
    assert (await api.get(f"{P}/other/partitions?checkAllowAutoCreation=true")).status == 404
    assert (await api.get(url)).body == {"partitions": 4}


async def test_the_embedded_client_is_refused_a_missing_topic_where_creation_is_off(api, service):
    assert (await api.post(f"{NS}/autoTopicCreation", {"allowAutoTopicCreation": False})).status == 204
    client = EmbeddedClient(service)
    try:
        with pytest.raises(TopicNotFoundError):
            await client.create_producer("persistent://public/default/never")
        with pytest.raises(TopicNotFoundError):
            await client.subscribe("persistent://public/default/never", "sub")
        assert not service.topic_exists("persistent://public/default/never")
        await service.get_topic("persistent://public/default/made")        # created on purpose: served
        producer = await client.create_producer("persistent://public/default/made")
        await producer.send(b"x")
    finally:
        await client.close()


async def test_openapi_document(api):
    document = (await api.get("/openapi.json")).body
    path = document["paths"]["/admin/v2/namespaces/{tenant}/{namespace}/autoTopicCreation"]
    assert set(path) == {"get", "post", "delete"}
    body = path["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert set(body["properties"]) == set(PARTITIONED)


async def test_cli(admin):
    assert (await admin("namespaces", "set-auto-topic-creation", "public/default", "-e", "-t", "partitioned",
                        "-n", "4"))[0] == 0
    assert (await admin("namespaces", "get-auto-topic-creation", "public/default"))[1] == PARTITIONED
    assert (await admin("namespaces", "set-auto-topic-creation", "public/default"))[0] == 0
    assert (await admin("namespaces", "get-auto-topic-creation", "public/default"))[1] == OFF
    assert (await admin("namespaces", "set-auto-topic-creation", "public/default", "-e"))[0] == 0
    assert (await admin("namespaces", "get-auto-topic-creation", "public/default"))[1] == {
        "allowAutoTopicCreation": True, "topicType": "non-partitioned", "defaultNumPartitions": None}
    code, _, err = await admin("namespaces", "set-auto-topic-creation", "public/default", "-e", "-t", "partitioned")
    assert code != 0 and "defaultNumPartitions" in err
    assert (await admin("namespaces", "remove-auto-topic-creation", "public/default"))[0] == 0
    assert (await admin("namespaces", "get-auto-topic-creation", "public/default"))[1] is None


@pytest.mark.parametrize("argv", [("-t", "sharded"), ("-n", "four")])
def test_cli_refuses_bad_arguments(argv):
    with pytest.raises(SystemExit):
        main(["admin", "namespaces", "set-auto-topic-creation", "public/default", "-e", *argv])


def test_serve_flags_set_the_brokers_default(tmp_path):
    default = broker_config(serve_args("--data-dir", str(tmp_path))).auto_topic_creation()
    assert (default.allowed, default.partitions) == (True, 0)                  # Pulsar's defaults
    config = broker_config(serve_args("--data-dir", str(tmp_path), "--no-auto-topic-creation"))
    assert not config.auto_topic_creation().allowed
    config = broker_config(serve_args("--data-dir", str(tmp_path), "--auto-topic-creation-type", "partitioned",
                                      "--default-num-partitions", "6"))
    assert dataclasses.astuple(config.auto_topic_creation()) == (True, "partitioned", 6)


@pytest.mark.parametrize("argv", [("--auto-topic-creation-type", "sharded"), ("--default-num-partitions", "0"),
                                  ("--default-num-partitions", "10001"), ("--default-num-partitions", "x")])
def test_serve_refuses_bad_flags(tmp_path, capsys, argv):
    with pytest.raises(SystemExit) as exit_info:
        serve_args("--data-dir", str(tmp_path), *argv)
    assert exit_info.value.code == 2 and argv[0] in capsys.readouterr().err
