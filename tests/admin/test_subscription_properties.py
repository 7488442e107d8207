"""Subscription properties (PIP-105) through the admin API and `pyengine admin`: given when a
subscription is created (by a consumer or by create-subscription), read and replaced whole by
GET / PUT .../subscription/{sub}/properties, shown in the topic stats, kept across a restart;
on a partitioned topic set on every partition and read from all of them together, as Pulsar.
Malformed bodies are refused and change nothing."""

from __future__ import annotations

from pyengine.client.message import MessageId
from pyengine.subscription_properties import MAX_SUBSCRIPTION_PROPERTIES_BYTES
from tests.admin.conftest import restartable_broker

P = "/admin/v2/persistent/public/default"
T = "persistent://public/default"


async def test_a_consumer_creates_its_subscription_with_properties_and_the_admin_api_replaces_them(api, client):
    consumer = await client.subscribe(f"{T}/t", "s", subscription_properties={"team": "billing", "tier": "1"})
    assert (await api.get(f"{P}/t/subscription/s/properties")).body == {"team": "billing", "tier": "1"}
    assert (await api.get(f"{P}/t/stats")).body["subscriptions"]["s"]["subscriptionProperties"] == \
        {"team": "billing", "tier": "1"}
    assert (await api.put(f"{P}/t/subscription/s/properties", {"tier": "2"})).status == 204
    assert (await api.get(f"{P}/t/subscription/s/properties")).body == {"tier": "2"}
    assert (await api.put(f"{P}/t/subscription/s/properties", {})).status == 204
    assert (await api.get(f"{P}/t/subscription/s/properties")).body == {}
    await consumer.close()


async def test_properties_of_a_later_subscribe_are_ignored(api, client):
    first = await client.subscribe(f"{T}/t", "s", consumer_type="shared", subscription_properties={"a": "1"})
    second = await client.subscribe(f"{T}/t", "s", consumer_type="shared", subscription_properties={"b": "2"})
    await second.close()
    await first.close()
    again = await client.subscribe(f"{T}/t", "s", subscription_properties={"c": "3"})
    assert (await api.get(f"{P}/t/subscription/s/properties")).body == {"a": "1"}
    await again.close()


async def test_create_subscription_takes_properties_and_an_existing_one_keeps_its_own(api):
    body = {"ledgerId": -1, "entryId": -1, "properties": {"k": "v"}}
    assert (await api.put(f"{P}/t/subscription/s", body)).status == 204
    assert (await api.get(f"{P}/t/subscription/s/properties")).body == {"k": "v"}
    assert (await api.put(f"{P}/t/subscription/s", {**body, "properties": {"other": "x"}})).status == 409
    assert (await api.get(f"{P}/t/subscription/s/properties")).body == {"k": "v"}
    assert (await api.put(f"{P}/t/subscription/plain")).status == 204
    assert (await api.get(f"{P}/t/subscription/plain/properties")).body == {}


async def test_a_missing_subscription_or_topic_is_404(api):
    await api.put(f"{P}/t")
    assert (await api.get(f"{P}/t/subscription/nobody/properties")).status == 404
    assert (await api.put(f"{P}/t/subscription/nobody/properties", {"a": "b"})).status == 404
    assert (await api.get(f"{P}/missing/subscription/s/properties")).status == 404
    assert (await api.put(f"{P}/missing/subscription/s/properties", {"a": "b"})).status == 404


async def test_malformed_bodies_are_400_and_change_nothing(api):
    await api.put(f"{P}/t/subscription/s", {"ledgerId": -1, "entryId": -1, "properties": {"keep": "me"}})
    too_large = {"k": "v" * MAX_SUBSCRIPTION_PROPERTIES_BYTES}
    for raw in ["", "null", "[]", '"text"', "1", "{", '{"a": 1}', '{"a": null}', '{"a": ["b"]}',
                '{"a": {"b": "c"}}', '{"a": "\\ud800"}']:
        reply = await api.put(f"{P}/t/subscription/s/properties", raw=raw)
        assert reply.status == 400 and "reason" in reply.body, (raw, reply)
    reply = await api.put(f"{P}/t/subscription/s/properties", too_large)
    assert reply.status == 400 and "more than" in reply.body["reason"]
    assert (await api.get(f"{P}/t/subscription/s/properties")).body == {"keep": "me"}
    # A new subscription's properties are checked before anything is created.
    for properties in [{"a": 1}, ["a"], "a", too_large]:
        reply = await api.put(f"{P}/t/subscription/new", {"ledgerId": -1, "entryId": -1, "properties": properties})
        assert reply.status == 400, (properties, reply)
    reply = await api.put(f"{P}/fresh/subscription/new", {"ledgerId": -1, "entryId": -1, "properties": too_large})
    assert reply.status == 400
    assert (await api.get(f"{P}/t/subscriptions")).body == ["s"]
    assert (await api.get(f"{P}/fresh/stats")).status == 404         # not created for a refused request


async def test_a_partitioned_topic_sets_every_partition_and_reads_them_together(api, service):
    await api.put(f"{P}/pt/partitions", 3)
    assert (await api.put(f"{P}/pt/subscription/s", {"ledgerId": -1, "entryId": -1,
                                                     "properties": {"a": "1"}})).status == 204
    for index in range(3):
        assert (await api.get(f"{P}/pt-partition-{index}/subscription/s/properties")).body == {"a": "1"}
    assert (await api.put(f"{P}/pt/subscription/s/properties", {"b": "2"})).status == 204
    for index in range(3):
        assert (await api.get(f"{P}/pt-partition-{index}/subscription/s/properties")).body == {"b": "2"}
    # One partition changed alone: the partitioned topic's answer holds every partition's.
    assert (await api.put(f"{P}/pt-partition-1/subscription/s/properties", {"c": "3"})).status == 204
    assert (await api.get(f"{P}/pt/subscription/s/properties")).body == {"b": "2", "c": "3"}
    stats = (await api.get(f"{P}/pt/partitioned-stats")).body
    assert stats["subscriptions"]["s"]["subscriptionProperties"] == {"b": "2", "c": "3"}
    assert stats["partitions"][f"{T}/pt-partition-0"]["subscriptions"]["s"]["subscriptionProperties"] == {"b": "2"}
    assert (await api.get(f"{P}/pt/subscription/nobody/properties")).status == 404


async def test_properties_survive_a_restart(tmp_path):
    async with restartable_broker(tmp_path / "data") as (_, api, client):
        consumer = await client.subscribe(f"{T}/t", "by-consumer", subscription_properties={"a": "1"})
        await consumer.close()
        await api.put(f"{P}/t/subscription/by-admin", {"ledgerId": -1, "entryId": -1, "properties": {"b": "2"}})
        await api.put(f"{P}/t/subscription/by-consumer/properties", {"a": "changed"})
    async with restartable_broker(tmp_path / "data") as (_, api, _client):
        assert (await api.get(f"{P}/t/subscription/by-consumer/properties")).body == {"a": "changed"}
        assert (await api.get(f"{P}/t/subscription/by-admin/properties")).body == {"b": "2"}


async def test_a_readers_properties_are_in_its_stats(api, client, service):
    await api.put(f"{P}/t")
    topic = await service.get_topic(f"{T}/t")
    reader = await client.create_reader(f"{T}/t", MessageId.earliest)
    (name, subscription), = topic.non_durable_subscriptions().items()
    await subscription.update_subscription_properties({"r": "1"})
    stats = (await api.get(f"{P}/t/stats")).body["subscriptions"][name]
    assert stats["isDurable"] is False and stats["subscriptionProperties"] == {"r": "1"}
    # Readers are not subscriptions of the admin API (as Pulsar lists durable ones only).
    assert (await api.get(f"{P}/t/subscription/{name}/properties")).status == 404
    await reader.close()


async def test_the_cli_gets_and_updates_properties(admin, api):
    status, _, _ = await admin("topics", "create-subscription", f"{T}/t", "-s", "s", "-p", "a=1", "-p", "b=x=y")
    assert status == 0
    assert await admin("topics", "get-subscription-properties", f"{T}/t", "-s", "s") == \
        (0, {"a": "1", "b": "x=y"}, "")
    assert (await admin("topics", "update-subscription-properties", f"{T}/t", "-s", "s", "-p", "c=3"))[0] == 0
    assert (await admin("topics", "get-subscription-properties", f"{T}/t", "-s", "s"))[1] == {"c": "3"}
    status, _, err = await admin("topics", "update-subscription-properties", f"{T}/t", "-s", "s")
    assert status == 1 and "--clear" in err
    status, _, err = await admin("topics", "update-subscription-properties", f"{T}/t", "-s", "s", "-p", "d=4", "-c")
    assert status == 1 and "--clear" in err
    assert (await admin("topics", "get-subscription-properties", f"{T}/t", "-s", "s"))[1] == {"c": "3"}
    assert (await admin("topics", "update-subscription-properties", f"{T}/t", "-s", "s", "--clear"))[0] == 0
    assert (await admin("topics", "get-subscription-properties", f"{T}/t", "-s", "s"))[1] == {}
    status, _, err = await admin("topics", "get-subscription-properties", f"{T}/t", "-s", "nobody")
    assert status == 1 and "HTTP 404" in err
