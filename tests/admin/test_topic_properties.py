"""Topic properties, as Pulsar 2.10's: given at creation (a non-partitioned topic's body, a
partitioned topic's PartitionedTopicMetadata body), read, merged and removed through
`.../{topic}/properties`, kept across a restart and deleted with their topic; the broker's own
ledger properties are neither shown nor changed through them."""

from __future__ import annotations

from pyengine.broker.service import TXN_VERSION_PROPERTY
from pyengine.protocol.access_modes import TOPIC_EPOCH_PROPERTY

from tests.admin.conftest import restartable_broker

T = "/admin/v2/persistent/public/default"
METADATA_MEDIA_TYPE = "application/vnd.partitioned-topic-metadata+json"       # Pulsar's admin client's


async def properties_of(api, topic: str) -> dict:
    reply = await api.get(f"{T}/{topic}/properties")
    assert reply.status == 200, reply.body
    return reply.body


async def test_a_topic_created_with_properties_has_them(api):
    assert (await api.put(f"{T}/plain", {"owner": "team-a", "tier": "gold"})).status == 204
    assert await properties_of(api, "plain") == {"owner": "team-a", "tier": "gold"}
    assert (await api.put(f"{T}/bare")).status == 204                 # no body: none
    assert await properties_of(api, "bare") == {}
    assert (await api.put(f"{T}/empty", {})).status == 204             # as Pulsar's client sends it
    assert await properties_of(api, "empty") == {}


async def test_update_merges_and_remove_takes_one_key(api):
    await api.put(f"{T}/t", {"a": "1", "b": "2"})
    assert (await api.put(f"{T}/t/properties", {"b": "two", "c": "3"})).status == 204
    assert await properties_of(api, "t") == {"a": "1", "b": "two", "c": "3"}
    assert (await api.put(f"{T}/t/properties", {})).status == 204      # nothing to change
    assert (await api.delete(f"{T}/t/properties?key=a")).status == 204
    assert (await api.delete(f"{T}/t/properties?key=never-set")).status == 204
    assert await properties_of(api, "t") == {"b": "two", "c": "3"}


async def test_a_partitioned_topic_keeps_its_properties_in_its_metadata(api, service):
    reply = await api.call("PUT", f"{T}/p/partitions", raw='{"partitions": 2, "properties": {"k": "v"}}')
    assert reply.status == 204, reply.body
    assert (await api.get(f"{T}/p/partitions")).body == {"partitions": 2, "properties": {"k": "v"}}
    assert await properties_of(api, "p") == {"k": "v"}
    assert await properties_of(api, "p-partition-0") == {}             # a partition has its own
    assert (await api.put(f"{T}/p/properties", {"x": "y"})).status == 204
    assert (await api.delete(f"{T}/p/properties?key=k")).status == 204
    assert await properties_of(api, "p") == {"x": "y"}
    assert service.policies.partitioned_properties("persistent://public/default/p") == {"x": "y"}
    # Growing it keeps them.
    assert (await api.post(f"{T}/p/partitions", 3)).status == 204
    assert await properties_of(api, "p") == {"x": "y"}
    # A plain count still creates one without any (and is stored as before: a bare number).
    assert (await api.put(f"{T}/q/partitions", 2)).status == 204
    assert (await api.get(f"{T}/q/partitions")).body == {"partitions": 2}
    assert service.policies._get("/admin/partitioned/persistent://public/default/q") == 2


async def test_the_metadata_body_is_taken_with_pulsars_media_type(api, server):
    import aiohttp

    async with aiohttp.ClientSession() as session:
        async with session.put(f"{server.url}{T}/m/partitions", data='{"partitions": 3, "properties": {"a": "b"}}',
                               headers={"Content-Type": METADATA_MEDIA_TYPE}) as reply:
            assert reply.status == 204
    assert await properties_of(api, "m") == {"a": "b"}


async def test_the_brokers_own_ledger_properties_are_apart(api, service, client):
    await api.put(f"{T}/t", {TXN_VERSION_PROPERTY: "mine"})
    topic = service.topics["persistent://public/default/t"]
    await topic.ledger.set_property(TOPIC_EPOCH_PROPERTY, "7")
    assert await properties_of(api, "t") == {TXN_VERSION_PROPERTY: "mine"}
    await api.put(f"{T}/t/properties", {TOPIC_EPOCH_PROPERTY: "0"})
    await api.delete(f"{T}/t/properties?key={TXN_VERSION_PROPERTY}")
    # The broker's stay as they were: the user's keys are other entries of the ledger's map.
    assert topic.ledger.properties[TOPIC_EPOCH_PROPERTY] == "7"
    assert topic.ledger.properties[TXN_VERSION_PROPERTY] in ("4", "5")
    assert await properties_of(api, "t") == {TOPIC_EPOCH_PROPERTY: "0"}


async def test_properties_survive_a_restart_and_go_with_their_topic(tmp_path):
    data = tmp_path / "data"
    async with restartable_broker(data, num_coordinators=1) as (_, api, _client):
        await api.put(f"{T}/t", {"a": "1"})
        await api.put(f"{T}/t/properties", {"b": "2"})
        await api.call("PUT", f"{T}/p/partitions", raw='{"partitions": 2, "properties": {"c": "3"}}')
    async with restartable_broker(data, num_coordinators=1) as (_, api, _client):
        assert await properties_of(api, "t") == {"a": "1", "b": "2"}
        assert await properties_of(api, "p") == {"c": "3"}
        assert (await api.delete(f"{T}/t")).status == 204
        assert (await api.delete(f"{T}/p/partitions")).status == 204
        assert (await api.get(f"{T}/t/properties")).status == 404
        assert (await api.get(f"{T}/p/properties")).status == 404
        # Created again under the same names: none of the old ones.
        await api.put(f"{T}/t")
        await api.put(f"{T}/p/partitions", 2)
        assert await properties_of(api, "t") == {}
        assert await properties_of(api, "p") == {}


async def test_missing_topics_and_namespaces_are_404(api):
    for method, path, body in [("GET", "/properties", None), ("PUT", "/properties", {"a": "b"}),
                               ("DELETE", "/properties?key=a", None)]:
        assert (await api.call(method, f"{T}/nope{path}", body)).status == 404
        assert (await api.call(method, f"/admin/v2/persistent/public/nons/nope{path}", body)).status == 404
    assert "persistent://public/default/nope" not in (await api.get(T)).body      # none was created


async def test_bad_properties_are_refused_and_change_nothing(api, service):
    await api.put(f"{T}/t", {"kept": "yes"})
    for body in ['{"a": 1}', '{"a": null}', '{"": "x"}', '["a"]', '"a=b"', '{"a": "\\ud800"}']:
        reply = await api.call("PUT", f"{T}/t/properties", raw=body)
        assert reply.status == 400 and reply.body["reason"], body
        reply = await api.call("PUT", f"{T}/new", raw=body)
        assert reply.status == 400, body
    assert await properties_of(api, "t") == {"kept": "yes"}
    assert not service.topic_exists("persistent://public/default/new")
    for body in ['{"partitions": 2, "properties": {"a": 1}}', '{"partitions": 2, "properties": {"": "x"}}',
                 '{"properties": {"a": "b"}}', '{"partitions": "2"}']:
        reply = await api.call("PUT", f"{T}/np/partitions", raw=body)
        assert reply.status == 400, body
    reply = await api.call("PUT", f"{T}/np/partitions", raw='{"partitions": 0, "properties": {"a": "b"}}')
    assert reply.status == 406                      # out of range, as for a bare count
    assert (await api.get(f"{T}/np/partitions")).status == 404
    assert (await api.delete(f"{T}/t/properties")).status == 400       # which key?
    assert (await api.delete(f"{T}/t/properties?key=")).status == 400


async def test_the_cli(admin):
    topic = "persistent://public/default/c"
    assert (await admin("topics", "create", topic, "-m", "a=1,b=2", "-m", "c=3"))[0] == 0
    assert (await admin("topics", "get-properties", topic))[1] == {"a": "1", "b": "2", "c": "3"}
    assert (await admin("topics", "update-properties", topic, "-p", "b=two", "-p", "d=x=y"))[0] == 0
    assert (await admin("topics", "remove-properties", topic, "-k", "a"))[0] == 0
    assert (await admin("topics", "get-properties", topic))[1] == {"b": "two", "c": "3", "d": "x=y"}
    partitioned = "persistent://public/default/cp"
    assert (await admin("topics", "create-partitioned-topic", partitioned, "-p", "2", "-m", "k=v"))[0] == 0
    assert (await admin("topics", "get-partitioned-topic-metadata", partitioned))[1] == {
        "partitions": 2, "properties": {"k": "v"}}
    assert (await admin("topics", "get-properties", partitioned))[1] == {"k": "v"}
    status, _, err = await admin("topics", "get-properties", "persistent://public/default/none")
    assert status == 1 and "404" in err
