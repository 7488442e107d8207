"""The broker's own resources, as Pulsar's: /status.html, /admin/v2/brokers/ready, the health
check (/admin/v2/brokers/health: a message round trip on the heartbeat topic), the brokers of a
cluster, the version, and `pyengine admin brokers ...`."""

from __future__ import annotations

import asyncio
import json

import pytest

import pyengine
from pyengine.admin import routes_brokers
from pyengine.broker.policies import HEALTH_CHECK_TOPIC
from pyengine.broker.service import BrokerService
from pyengine.cli import main
from pyengine.protocol import lookup
from tests.protocol.stalled_storage import StalledPublishes

B = "/admin/v2/brokers"


async def test_status_ready_version_and_brokers_of_the_cluster(api, service, server):
    status = await api.get("/status.html")
    assert (status.status, status.body, status.headers["Content-Type"]) == (200, "OK", "text/plain; charset=utf-8")
    assert ((await api.get(f"{B}/ready")).status, (await api.get(f"{B}/ready")).body) == (200, "ok")
    assert (await api.get(f"{B}/version")).body == pyengine.__version__
    service.web_service_url = server.url
    assert (await api.get(f"{B}/standalone")).body == [server.url.split("://")[1]]
    assert (await api.get(f"{B}/elsewhere")).status == 404


async def test_a_health_check_sends_and_reads_back_on_the_heartbeat_topic(api, service):
    for _ in range(3):                   # each reads its own message, not an earlier check's
        reply = await api.get(f"{B}/health")
        assert (reply.status, reply.body) == (200, "ok")
    assert (await api.get(f"{B}/health?topicVersion=V2")).body == "ok"
    topic = await service.get_topic(HEALTH_CHECK_TOPIC, create=False)
    assert topic.ledger.number_of_entries >= 4
    assert not topic.producers and not topic.subscriptions        # the check's clients are gone
    # Nothing consumed is kept (the broker's default keeps everything), and the topic is the
    # broker's own: not listed to clients.
    assert service.policies.retention(HEALTH_CHECK_TOPIC).to_json() == {"retentionTimeInMinutes": 0,
                                                                         "retentionSizeInMB": 0}
    assert HEALTH_CHECK_TOPIC not in lookup.topics_of_namespace(service, "pulsar/system", 2)


async def test_concurrent_health_checks_each_succeed(api):
    replies = await asyncio.gather(*(api.get(f"{B}/health") for _ in range(4)))
    assert [(r.status, r.body) for r in replies] == [(200, "ok")] * 4


async def test_a_check_whose_message_never_comes_back_is_500_after_its_timeout(api, service, monkeypatch):
    monkeypatch.setattr(routes_brokers, "HEALTH_CHECK_TIMEOUT_S", 0.5)
    topic = await service.get_topic(HEALTH_CHECK_TOPIC)
    stalled = StalledPublishes(topic, monkeypatch)
    reply = await api.get(f"{B}/health")
    assert reply.status == 500 and "timed out" in reply.body["reason"]
    await stalled.release()


async def test_a_check_that_fails_is_500_with_the_reason(api, service, monkeypatch):
    topic = await service.get_topic(HEALTH_CHECK_TOPIC)

    def failing_publish(*args, **kwargs):
        raise OSError("disk on fire")
    monkeypatch.setattr(topic, "publish", failing_publish)
    reply = await api.get(f"{B}/health")
    assert reply.status == 500 and "disk on fire" in reply.body["reason"]


async def test_a_broker_that_does_not_serve_fails_its_probes(api, monkeypatch):
    monkeypatch.setattr(BrokerService, "serving", property(lambda self: False))
    assert (await api.get("/status.html")).status == 503
    assert (await api.get(f"{B}/ready")).status == 500
    assert (await api.get(f"{B}/health")).status == 503


@pytest.mark.parametrize("query", ["topicVersion=V3", "topicVersion=", "brokerId=", "brokerId=other"])
async def test_malformed_or_foreign_health_checks_are_refused(api, query):
    reply = await api.get(f"{B}/health?{query}")
    assert reply.status == (404 if query == "brokerId=other" else 400), reply
    assert "reason" in reply.body


async def test_cli(service, server, capsys):
    """Text replies are printed as they are (pulsar-admin prints `ok`), JSON ones as JSON."""
    service.web_service_url = server.url

    async def admin(*args: str) -> tuple[int, str, str]:
        status = await asyncio.to_thread(main, ["admin", "--url", server.url, *args])
        out, err = capsys.readouterr()
        return status, out, err

    assert await admin("brokers", "healthcheck") == (0, "ok\n", "")
    assert await admin("brokers", "ready") == (0, "ok\n", "")
    status, out, _ = await admin("brokers", "list", "standalone")
    assert status == 0 and json.loads(out) == [server.url.split("://")[1]]
    status, _, err = await admin("brokers", "list", "nope")
    assert status == 1 and "Cluster nope does not exist" in err
