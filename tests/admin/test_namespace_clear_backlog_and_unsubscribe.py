"""Namespace-wide subscription operations, as Pulsar's: POST .../namespaces/{t}/{ns}/clearBacklog
(every subscription, or one: /clearBacklog/{sub}) and /unsubscribe/{sub} over every topic of the
namespace, partitions and topics not loaded included, the broker's own topics and compaction
subscriptions left alone; and `pyengine admin namespaces clear-backlog|unsubscribe`."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.broker.compaction import COMPACTION_SUBSCRIPTION
from pyengine.cli import main

NS = "/admin/v2/namespaces/public/default"
T = "persistent://public/default"


async def filled(service, client) -> None:
    """Two plain topics and a partitioned one, each with subscriptions a and b, 3 messages each."""
    await service.policies.create_partitioned_topic(f"{T}/parted", 2)
    for name in ("one", "two", "parted-partition-0", "parted-partition-1"):
        topic = await service.get_topic(f"{T}/{name}")
        for sub in ("a", "b"):
            await topic.open_subscription(sub, "earliest")
        producer = await client.create_producer(f"{T}/{name}")
        for i in range(3):
            await producer.send(b"x")
        await producer.close()


def backlogs(service) -> dict[tuple[str, str], int]:
    return {(topic.name.rsplit("/", 1)[1], name): sub.cursor.backlog()
            for topic in service.topics.values() if topic.name.startswith(T)
            for name, sub in topic.subscriptions.items()}


async def test_clear_backlog_of_every_subscription_or_one(api, service, client):
    await filled(service, client)
    await service.unload_namespace("public/default")          # not loaded: cleared all the same
    assert (await api.post(f"{NS}/clearBacklog/a")).status == 204
    for name in ("one", "two", "parted-partition-0", "parted-partition-1"):
        await service.get_topic(f"{T}/{name}", create=False)
    assert {key: value for key, value in backlogs(service).items()} == {
        (name, sub): 0 if sub == "a" else 3 for name in ("one", "two", "parted-partition-0", "parted-partition-1")
        for sub in ("a", "b")}
    assert (await api.post(f"{NS}/clearBacklog?force=true")).status == 204
    assert set(backlogs(service).values()) == {0}


async def test_clear_backlog_leaves_compaction_alone_and_stops_at_an_open_transaction(api, service, client):
    await filled(service, client)
    topic = await service.get_topic(f"{T}/one")
    compaction = await topic.open_subscription(COMPACTION_SUBSCRIPTION, "earliest")
    txn = await client.new_transaction()
    producer = await client.create_producer(f"{T}/one")
    await producer.send(b"in txn", txn=txn)
    await producer.send(b"after")
    assert (await api.post(f"{NS}/clearBacklog")).status == 204
    assert compaction.cursor.backlog() > 0
    await txn.commit()
    consumer = await client.subscribe(f"{T}/one", "a")
    assert [(await consumer.receive(5)).data for _ in range(2)] == [b"in txn", b"after"]


async def test_unsubscribe_deletes_the_subscription_everywhere_but_where_consumers_are(api, service, client):
    await filled(service, client)
    consumer = await client.subscribe(f"{T}/two", "a")
    reply = await api.post(f"{NS}/unsubscribe/a")
    assert reply.status == 412 and f"{T}/two" in reply.body["reason"]
    assert {key for key in backlogs(service) if key[1] == "a"} == {("two", "a")}
    await consumer.close()
    assert (await api.post(f"{NS}/unsubscribe/a")).status == 204
    assert {key[1] for key in backlogs(service)} == {"b"}
    assert (await api.post(f"{NS}/unsubscribe/nobody")).status == 204       # nothing to delete: done


@pytest.mark.parametrize(("path", "status"), [("/admin/v2/namespaces/public/nope/clearBacklog", 404),
                                              ("/admin/v2/namespaces/public/nope/unsubscribe/a", 404),
                                              (f"{NS}/clearBacklog?force=maybe", 400),
                                              ("/admin/v2/namespaces/public/bad%20name/clearBacklog", 412)])
async def test_bad_requests(api, path, status):
    reply = await api.post(path)
    assert reply.status == status, reply


async def test_cli(service, client, server, capsys):
    await filled(service, client)

    async def admin(*args: str) -> int:
        status = await asyncio.to_thread(main, ["admin", "--url", server.url, "namespaces", *args])
        capsys.readouterr()
        return status

    assert await admin("clear-backlog", "public/default", "-s", "b", "-force") == 0
    assert {key: value for key, value in backlogs(service).items() if key[1] == "b"} == {
        (name, "b"): 0 for name in ("one", "two", "parted-partition-0", "parted-partition-1")}
    assert await admin("unsubscribe", "public/default", "-s", "a") == 0
    assert {key[1] for key in backlogs(service)} == {"b"}
