"""The broker itself, as Pulsar's /admin/v2/brokers and /status.html answer for it: whether it is
up and serving (load balancers, orchestrators' probes, `pulsar-admin brokers healthcheck`),
the brokers of the cluster, and the version.

The health check is Pulsar's: a message sent on a heartbeat topic must come back to a reader of
it, so the storage and dispatch paths are exercised, not only the HTTP server. Ours has one
heartbeat topic in the system namespace (Pulsar's V1 and V2 names differ only in the namespace
they give the broker's address); it keeps no consumed message (retention 0 on the topic).
"""

from __future__ import annotations

import asyncio
import uuid

from aiohttp import web

from pyengine import __version__
from pyengine.admin.errors import INTERNAL_ERROR, NOT_FOUND, UNAVAILABLE, AdminError
from pyengine.admin.routing import Call, Param, Reply, RouteTable
from pyengine.admin.schemas import STRING_LIST, error, errors
from pyengine.broker.embedded import EmbeddedClient
from pyengine.broker.policies import HEALTH_CHECK_TOPIC
from pyengine.broker.service import BrokerService
from pyengine.broker.topic_changes import topic_change
from pyengine.client.message import MessageId
from pyengine.naming import TopicName

# Pulsar's HEALTH_CHECK_READ_TIMEOUT: under its admin client's 60 s read timeout.
HEALTH_CHECK_TIMEOUT_S = 58.0
TEXT = {"type": "string"}

routes = RouteTable("brokers")


def _text(body: str) -> web.Response:
    return web.Response(text=body, content_type="text/plain")


@routes.add("GET", "/status.html", summary="Whether the broker is up (a load balancer's check): OK, or 503 while it "
            "starts or stops.", replies={200: Reply("OK", TEXT, media_type="text/plain"), **errors(503)})
async def get_status(call: Call) -> web.Response:
    if not call.service.serving:
        raise AdminError(UNAVAILABLE, "the broker is not serving (starting or stopping)")
    return _text("OK")


@routes.add("GET", "/admin/v2/brokers/ready", summary="Whether the broker has started and serves: ok, else 500.",
            replies={200: Reply("ok", TEXT, media_type="text/plain"), 500: error("Broker is not ready")})
async def is_ready(call: Call) -> web.Response:
    if not call.service.serving:
        raise AdminError(INTERNAL_ERROR, "Broker is not ready")
    return _text("ok")


TOPIC_VERSION = Param("topicVersion", {"type": "string", "enum": ["V1", "V2"]},
                      "Pulsar's heartbeat topic naming (both check this broker's one heartbeat topic)")
BROKER_ID = Param("brokerId", {"type": "string", "minLength": 1}, "the broker to check (only this one is served "
                  "here: another is 404)")


@routes.add("GET", "/admin/v2/brokers/health", summary="Run a health check: a message sent on the broker's heartbeat "
            "topic must come back to a reader of it within 58 s. ok, else 500 with the reason (503 while stopping).",
            params=(TOPIC_VERSION, BROKER_ID),
            replies={200: Reply("ok", TEXT, media_type="text/plain"), **errors(404, 503),
                     500: error("The message did not come back, or a step of the check failed")})
async def health_check(call: Call) -> web.Response:
    service = call.service
    if not service.serving:
        raise AdminError(UNAVAILABLE, "the broker is not serving (starting or stopping)")
    if call["brokerId"] is not None and call["brokerId"] != service.broker_id:
        raise AdminError(NOT_FOUND, f"broker {call['brokerId']} is not this broker ({service.broker_id})")
    try:
        await asyncio.wait_for(run_health_check(service), HEALTH_CHECK_TIMEOUT_S)
    except TimeoutError:
        raise AdminError(INTERNAL_ERROR, f"health check timed out after {HEALTH_CHECK_TIMEOUT_S:g} s: the message "
                                         f"sent on {HEALTH_CHECK_TOPIC} did not come back") from None
    except AdminError:
        raise
    except Exception as exc:
        raise AdminError(INTERNAL_ERROR, f"health check failed: {type(exc).__name__}: {exc}") from exc
    return _text("ok")


async def run_health_check(service: BrokerService) -> None:
    """Send a fresh message on the heartbeat topic and read until it comes back."""
    await _keep_nothing_consumed(service)
    client = EmbeddedClient(service)
    try:
        producer = await client.create_producer(HEALTH_CHECK_TOPIC)
        reader = await client.create_reader(HEALTH_CHECK_TOPIC, MessageId.latest)
        payload = uuid.uuid4().hex.encode()
        await producer.send(payload)
        while (await reader.read_next()).data != payload:
            pass                  # an earlier check's message, sent after this reader started
    finally:
        await client.close()


async def _keep_nothing_consumed(service: BrokerService) -> None:
    """Retention 0 on the heartbeat topic, set once: with the broker's default (keep
    everything), every check would leave its message stored for good."""
    if service.policies.topic_policies(HEALTH_CHECK_TOPIC).get("retention") is None:
        async with topic_change(service, TopicName.parse(HEALTH_CHECK_TOPIC)):
            await service.policies.set_topic_policy(HEALTH_CHECK_TOPIC, "retention",
                                                    {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0})


@routes.add("GET", "/admin/v2/brokers/version", summary="The broker's version.",
            replies={200: Reply("Version", TEXT, media_type="text/plain")})
async def get_version(call: Call) -> web.Response:
    return _text(__version__)


@routes.add("GET", "/admin/v2/brokers/{cluster}", summary="List the active brokers of a cluster (this one: its web "
            "service address, host:port).",
            params=(Param("cluster", {"type": "string"}, "cluster name", "path", required=True),),
            replies={200: Reply("Broker addresses", STRING_LIST), **errors(404)})
async def list_brokers(call: Call) -> list[str]:
    service = call.service
    if call["cluster"] != service.config.cluster_name:
        raise AdminError(NOT_FOUND, f"Cluster {call['cluster']} does not exist")
    url = service.web_service_url or ""
    return [url.split("://", 1)[-1]] if url else []
