"""`PUT .../{topic}/unload` and `PUT /admin/v2/namespaces/{tenant}/{namespace}/unload` (and
`pyengine admin topics|namespaces unload`): the topics are closed and forgotten, their clients
go on, and their next use loads them from storage. Pulsar's statuses: 204, 404 for a topic or
namespace that does not exist."""

from __future__ import annotations

from tests.broker.helpers import drain

P = "/admin/v2/persistent/public/default"
NS = "/admin/v2/namespaces/public/default"


async def test_unload_a_topic_its_clients_go_on(api, service, client):
    topic = "persistent://public/default/plain"
    producer = await client.create_producer(topic)
    consumer = await client.subscribe(topic, "s", initial_position="earliest")
    await producer.send(b"before")
    await consumer.acknowledge(await consumer.receive(timeout=5))
    loaded = service.topics[topic]
    assert (await api.put(f"{P}/plain/unload")).status == 204
    assert loaded.closed and service.topics.get(topic) is not loaded
    await producer.send(b"after")                         # attached again: loads it
    assert [m.data for m in await drain(consumer)] == [b"after"]
    assert (await api.put(f"{P}/plain/unload")).status == 204
    assert (await api.put(f"{P}/plain/unload")).status == 204       # not loaded: nothing to do
    assert (await api.get(f"{P}/plain/stats")).body["msgInCounter"] == 0      # (counters start again)


async def test_unload_a_partitioned_topic_unloads_each_partition(api, service, client):
    assert (await api.put(f"{P}/pt/partitions", 3)).status == 204
    names = [f"persistent://public/default/pt-partition-{i}" for i in range(3)]
    assert set(names) <= set(service.topics)              # created (and loaded) with it
    assert (await api.put(f"{P}/pt/unload")).status == 204
    assert not set(names) & set(service.topics)
    assert (await api.put(f"{P}/pt-partition-1/unload")).status == 204


async def test_unload_of_what_does_not_exist_is_404(api):
    assert (await api.put(f"{P}/missing/unload")).status == 404
    assert (await api.put("/admin/v2/persistent/public/nowhere/t/unload")).status == 404
    assert (await api.put("/admin/v2/namespaces/public/nowhere/unload")).status == 404
    assert (await api.put(f"{P}/%20padded/unload")).status == 412


async def test_unload_a_namespace(api, service, client):
    for name in ("a", "b"):
        await (await client.create_producer(f"persistent://public/default/{name}")).send(b"m")
    assert (await api.put(NS + "/unload")).status == 204
    assert not [name for name in service.topics if name.startswith("persistent://public/default/")]
    consumer = await client.subscribe("persistent://public/default/a", "s", initial_position="earliest")
    assert [m.data for m in await drain(consumer)] == [b"m"]


async def test_cli(admin, service, client):
    await (await client.create_producer("persistent://public/default/c")).send(b"m")
    assert await admin("topics", "unload", "c") == (0, None, "")
    assert "persistent://public/default/c" not in service.topics
    await client.create_producer("persistent://public/default/c")
    assert await admin("namespaces", "unload", "public/default") == (0, None, "")
    assert "persistent://public/default/c" not in service.topics
    status, _, err = await admin("topics", "unload", "missing")
    assert status == 1 and "not found" in err
