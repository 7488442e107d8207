"""Retention policies (Pulsar's RetentionPolicies) on namespaces and topics through the admin
API, what they do to a running broker's consumed ledgers, and its periodic retention check."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.broker.policies import Retention
from pyengine.broker.service import BrokerConfig, BrokerService
from pyengine.storage import ManagedLedger, ManagedLedgerConfig

NS = "/admin/v2/namespaces/public/default"
P = "/admin/v2/persistent/public/default"
TOPIC = "persistent://public/default/kept"


@pytest.fixture
async def service(tmp_path):
    """The admin fixtures' broker, with ledgers of 3 entries (so that topics have closed ones)."""
    broker = BrokerService(BrokerConfig(data_dir=tmp_path / "data", sync=False, num_coordinators=1,
                                        ledger=ManagedLedgerConfig(max_entries_per_ledger=3)))
    await broker.start()
    yield broker
    await broker.close()


async def consumed(client, service, count: int, *, subscription: str = "sub"):
    """`count` messages sent to TOPIC and acknowledged by `subscription`; its ledger."""
    consumer = await client.subscribe(TOPIC, subscription, initial_position="earliest")
    producer = await client.create_producer(TOPIC)
    for i in range(count):
        await producer.send(b"m%d" % i)
    for _ in range(count):
        await consumer.acknowledge(await consumer.receive(timeout=5))
    return service.topics[TOPIC].ledger


async def settled(ledger: ManagedLedger) -> None:
    while ledger._trimming is not None:
        await asyncio.wait([ledger._trimming])


async def test_a_namespace_retention_policy_is_set_read_and_removed(api):
    assert (await api.get(f"{NS}/retention")).status == 204                # not set: the broker's default
    policy = {"retentionTimeInMinutes": 60, "retentionSizeInMB": -1}
    assert (await api.post(f"{NS}/retention", policy)).status == 204
    assert (await api.get(f"{NS}/retention")).body == policy
    assert (await api.get(NS)).body["retention_policies"] == policy
    assert (await api.post(f"{NS}/retention", {"retentionTimeInMinutes": 0})).status == 204   # a missing field is 0
    assert (await api.get(f"{NS}/retention")).body == {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0}
    assert (await api.delete(f"{NS}/retention")).status == 204
    assert (await api.get(f"{NS}/retention")).status == 204
    assert (await api.get("/admin/v2/namespaces/public/nowhere/retention")).status == 404


@pytest.mark.parametrize("body", [
    [60, 100], "60m", {"retentionTimeInMinutes": "60"}, {"retentionSizeInMB": 1.5},
    {"retentionTimeInMinutes": -2, "retentionSizeInMB": 0}, {"retentionTimeInMinutes": 10, "retentionSizeInMB": 0},
    {"retentionTimeInMinutes": 0, "retentionSizeInMB": 5}, {"retentionTimeInMinutes": -1}, {"retentionTime": 10},
    None,
])
async def test_a_malformed_retention_policy_is_refused_and_changes_nothing(api, client, body):
    await client.create_producer(TOPIC)
    for path in (f"{NS}/retention", f"{P}/kept/retention"):
        reply = await api.post(path, body)
        assert reply.status == 400, (path, reply)
        assert reply.body["reason"]
        assert (await api.get(path)).status == 204
    assert (await api.post(f"{NS}/retention", raw="{not json")).status == 400
    lone_zero = await api.post(f"{NS}/retention", {"retentionTimeInMinutes": 10, "retentionSizeInMB": 0})
    assert "use -1 for no limit" in lone_zero.body["reason"]


async def test_consumed_ledgers_stay_by_default_and_go_once_a_policy_says(api, client, service):
    ledger = await consumed(client, service, 10)
    assert len(ledger.ledgers) == 4
    assert (await api.post(f"{P}/kept/trim")).status == 204
    assert len(ledger.ledgers) == 4                       # the broker's default keeps everything
    assert (await api.get(f"{P}/kept/retention?applied=true")).body == {"retentionTimeInMinutes": -1,
                                                                        "retentionSizeInMB": -1}
    await api.post(f"{NS}/retention", {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0})
    await asyncio.sleep(0.002)                            # closed more than 0 ms ago
    assert (await api.post(f"{P}/kept/trim")).status == 204
    assert len(ledger.ledgers) == 1                       # only the ledger being written to is left
    assert (await api.get(f"{P}/kept/internalStats")).body["ledgers"][0]["ledgerId"] == ledger.lac.ledger_id


async def test_a_topic_policy_overrides_the_namespace_and_applies_at_once(api, client, service):
    await api.post(f"{NS}/retention", {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0})
    keep = {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1}
    await client.create_producer(TOPIC)
    assert (await api.post(f"{P}/kept/retention", keep)).status == 204
    ledger = await consumed(client, service, 10)
    await asyncio.sleep(0.002)
    await api.post(f"{P}/kept/trim")
    assert len(ledger.ledgers) == 4                       # the topic's policy keeps them
    assert (await api.get(f"{P}/kept/retention")).body == keep
    assert (await api.delete(f"{P}/kept/retention")).status == 204      # the namespace's 0 / 0 again:
    await settled(ledger)                                               # applied and trimmed at once
    assert len(ledger.ledgers) == 1
    assert (await api.get(f"{P}/nowhere/retention")).status == 404
    assert (await api.post(f"{P}/nowhere/trim")).status == 404


async def test_a_subscription_holds_back_what_it_has_not_consumed(api, client, service):
    await api.post(f"{NS}/retention", {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0})
    slow = await client.subscribe(TOPIC, "slow", initial_position="earliest")
    ledger = await consumed(client, service, 10)
    await asyncio.sleep(0.002)
    await api.post(f"{P}/kept/trim")
    assert len(ledger.ledgers) == 4
    for _ in range(6):                                    # the slow one consumes the first two ledgers
        await slow.acknowledge(await slow.receive(timeout=5))
    await settled(ledger)
    assert len(ledger.ledgers) == 2
    assert [(await slow.receive(timeout=5)).data for _ in range(4)] == [b"m6", b"m7", b"m8", b"m9"]


async def test_the_broker_checks_the_retention_of_loaded_topics_periodically(tmp_path, monkeypatch):
    checked = []
    monkeypatch.setattr(ManagedLedger, "trim_soon", lambda ledger: checked.append(ledger.name))
    broker = BrokerService(BrokerConfig(data_dir=tmp_path / "data", sync=False, num_coordinators=1,
                                        retention=Retention(0, 0), retention_check_interval_s=0.02))
    await broker.start()
    try:
        await broker.get_topic(TOPIC)
        checked.clear()
        await asyncio.sleep(0.2)
        assert checked.count(TOPIC) >= 3
    finally:
        await broker.close()
    checked.clear()
    await asyncio.sleep(0.05)
    assert checked == []                                  # and stops with the broker


@pytest.mark.parametrize(("changes", "error"), [
    ({"retention": (0, 0)}, TypeError), ({"retention_check_interval_s": 0}, ValueError),
    ({"retention_check_interval_s": "2"}, ValueError), ({"retention_check_interval_s": True}, ValueError),
    ({"ledger": ManagedLedgerConfig(retention_ms=0)}, ValueError),
])
def test_a_malformed_broker_retention_config_is_refused(tmp_path, changes, error):
    with pytest.raises(error, match="retention"):
        BrokerConfig(data_dir=tmp_path, **changes)
