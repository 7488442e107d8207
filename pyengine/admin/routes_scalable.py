"""Scalable topics and their segments (PIP-468), the spec's two admin resources:

    /admin/v2/scalable/{tenant}/{namespace}[/{topic}[/stats|/subscriptions/{subscription}|
                                                    /split/{segmentId}|/merge/{segmentId1}/{segmentId2}]]
    /admin/v2/segments/{tenant}/{namespace}/{topic}/{descriptor}[/terminate]

plus two extensions a controller needs for segments on other brokers: GET of a segment's state
and DELETE of a segment's subscription.

Statuses as Pulsar's ScalableTopics resource: changes answer 204, a topic that exists 409, a
topic or segment that does not 404, a segment that cannot be split or merged (sealed, not
adjacent, one hash value wide) and numInitialSegments < 1 412. A split, merge or subscription
change that reaches a broker that is not the controller leader is forwarded to the leader's admin
API (503 naming the leader when it cannot be reached).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp.web import Response as web_response

from pyengine.admin.errors import NOT_FOUND, PRECONDITION_FAILED, AdminError
from pyengine.admin.names import namespace_name, subscription_name, topic_name
from pyengine.admin.routing import Call, Param, Reply, RouteTable
from pyengine.admin.schemas import DONE, NAMESPACE, STRING_LIST, SUBSCRIPTION, TENANT, TOPIC, errors
from pyengine.naming import TopicName, parse_segment_descriptor
from pyengine.scalable.controller import NotLeaderError
from pyengine.scalable.segments import SEGMENT_RATES
from pyengine.scalable.service import ScalableTopicService

routes = RouteTable("scalable topics")
BASE = "/admin/v2/scalable/{tenant}/{namespace}"
TOPIC_URL = BASE + "/{topic}"
SEGMENT_URL = "/admin/v2/segments/{tenant}/{namespace}/{topic}/{descriptor}"
TOPIC_PATH = (TENANT, NAMESPACE, TOPIC)
SEGMENT_ID_SCHEMA = {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}
SEGMENT_ID = Param("segmentId", SEGMENT_ID_SCHEMA, "id of an active segment", "path", required=True)
SEGMENT_ID1 = Param("segmentId1", SEGMENT_ID_SCHEMA, "id of an active segment", "path", required=True)
SEGMENT_ID2 = Param("segmentId2", SEGMENT_ID_SCHEMA, "id of the adjacent active segment", "path", required=True)
SUB = Param("subscription", SUBSCRIPTION.schema, "subscription name (URL-encoded)", "path", required=True)
DESCRIPTOR = Param("descriptor", {"type": "string", "minLength": 1, "maxLength": 64},
                   "{hexStart}-{hexEnd}-{segmentId}, e.g. 0000-7fff-1", "path", required=True)
NUM_SEGMENTS = Param("numInitialSegments", {"type": "integer", "minimum": -(2**31), "maximum": 65536},
                     "number of initial segments dividing the hash range evenly", default=1)
INCARNATION = Param("incarnation", {"type": "string", "minLength": 1, "maxLength": 64},
                    "the incarnation of the topic's layout the create is made for (a controller's): refused when "
                    "the topic's current layout is of another one")
PROPERTIES = {"type": "object", "additionalProperties": {"type": "string", "maxLength": 4096}, "maxProperties": 100}

HASH_RANGE = {"type": "object", "properties": {"start": {"type": "integer"}, "end": {"type": "integer"}}}
SEGMENT_INFO = {
    "type": "object",
    "properties": {"segmentId": {"type": "integer"}, "hashRange": HASH_RANGE,
                   "state": {"type": "string", "enum": ["ACTIVE", "SEALED"]},
                   "parentIds": {"type": "array", "items": {"type": "integer"}},
                   "childIds": {"type": "array", "items": {"type": "integer"}},
                   "createdAtEpoch": {"type": "integer"}, "sealedAtEpoch": {"type": "integer"}},
}
SCALABLE_TOPIC_METADATA = {
    "type": "object",
    "description": "ScalableTopicMetadata: the segment DAG",
    "properties": {"epoch": {"type": "integer"}, "nextSegmentId": {"type": "integer"},
                   "segments": {"type": "object", "additionalProperties": SEGMENT_INFO},
                   "properties": {"type": "object", "additionalProperties": {"type": "string"}},
                   "incarnation": {"type": "string", "description": "ours: drawn when the topic is created, kept "
                                   "by every layout derived from it (absent in layouts stored before it existed)"}},
}
SCALABLE_TOPIC_STATS = {
    "type": "object",
    "description": "ScalableTopicStats: segment counts, per-segment counters, subscriptions and their consumers",
    "properties": {"topic": {"type": "string"}, "epoch": {"type": "integer"},
                   "activeSegmentCount": {"type": "integer"}, "sealedSegmentCount": {"type": "integer"},
                   "segments": {"type": "object"}, "subscriptions": {"type": "object"},
                   "controllerBrokerUrl": {"type": "string", "nullable": True}},
}


FORWARDED = "X-Pyengine-Forwarded"


async def scalable(call: Call) -> ScalableTopicService:
    return await call.service.scalable_topics()


async def on_leader(call: Call, action: Callable[[ScalableTopicService], Awaitable[Any]]) -> Any:
    """Run a leader-only `action` here, or forward the request to the controller leader's admin
    API when another broker leads (Pulsar redirects to the leader; the caller sees no difference).
    A forwarded request is not forwarded again (503 naming the leader instead)."""
    service = await scalable(call)
    try:
        await action(service)
        return None
    except NotLeaderError as error:
        web = await service.resources.web_service_url(error.leader_url) if error.leader_url else None
        if web is None or call.request.headers.get(FORWARDED):
            raise
    request = call.request
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        async with session.request(request.method, web + request.rel_url.path_qs, data=await request.read(),
                                   headers={"Content-Type": "application/json", FORWARDED: "1"}) as reply:
            body = await reply.read()
            return web_response(status=reply.status, body=body or None,
                                content_type=reply.content_type if body else None)


def requested_topic(call: Call) -> TopicName:
    return topic_name(call["tenant"], call["namespace"], call["topic"], domain="topic")


def requested_segment(call: Call) -> str:
    parent = requested_topic(call)
    start, end, segment_id = parse_segment_descriptor(call["descriptor"])
    return str(TopicName.segment(parent, start, end, segment_id))


def check_namespace(call: Call) -> str:
    namespace = namespace_name(call["tenant"], call["namespace"])
    if not call.service.policies.namespace_exists(namespace):
        raise AdminError(NOT_FOUND, f"namespace {namespace} does not exist")
    return namespace


# --- scalable topics ------------------------------------------------------------------------

@routes.add("GET", BASE, summary="List the scalable topics of a namespace.", params=(TENANT, NAMESPACE),
            replies={200: Reply("topic:// names", STRING_LIST), **errors(404, 412)})
async def list_scalable_topics(call: Call) -> list[str]:
    return await (await scalable(call)).list_topics(check_namespace(call))


@routes.add("PUT", TOPIC_URL, summary="Create a scalable topic with numInitialSegments equal hash ranges.",
            params=(*TOPIC_PATH, NUM_SEGMENTS), body=PROPERTIES,
            replies={204: DONE, **errors(400, 404, 409, 412)})
async def create_scalable_topic(call: Call) -> None:
    check_namespace(call)
    count = call["numInitialSegments"]
    if count < 1:
        raise AdminError(PRECONDITION_FAILED, "numInitialSegments must be >= 1")
    await (await scalable(call)).create_topic(requested_topic(call), count, call.body or {})


@routes.add("GET", TOPIC_URL, summary="The scalable topic's metadata (its segment DAG).", params=TOPIC_PATH,
            replies={200: Reply("ScalableTopicMetadata", SCALABLE_TOPIC_METADATA), **errors(404, 412)})
async def get_scalable_topic_metadata(call: Call) -> dict[str, Any]:
    return (await (await scalable(call)).get_layout(requested_topic(call))).to_metadata()


@routes.add("DELETE", TOPIC_URL, summary="Delete a scalable topic and all its segment topics.",
            params=(*TOPIC_PATH, Param("force", {"type": "boolean"}, "accepted as Pulsar's; segments are deleted "
                                                                          "with their subscriptions", default=False)),
            replies={204: DONE, **errors(404, 412)})
async def delete_scalable_topic(call: Call) -> None:
    await (await scalable(call)).delete_topic(requested_topic(call))     # its schemas go with it


@routes.add("GET", TOPIC_URL + "/stats", summary="Aggregated stats: segment counts, per-segment counters, "
                                                 "subscriptions and consumers.",
            params=TOPIC_PATH, replies={200: Reply("ScalableTopicStats", SCALABLE_TOPIC_STATS), **errors(404, 412)})
async def get_scalable_topic_stats(call: Call) -> dict[str, Any]:
    controller = await (await scalable(call)).controller(requested_topic(call))
    return await controller.stats()


@routes.add("PUT", TOPIC_URL + "/subscriptions/{subscription}",
            summary="Create a subscription on every active segment of the scalable topic.",
            params=(*TOPIC_PATH, SUB), replies={204: DONE, **errors(404, 405, 412, 503)})
async def create_scalable_subscription(call: Call) -> Any:
    async def create(service: ScalableTopicService) -> None:
        await (await service.leader(requested_topic(call))).create_subscription(
            subscription_name(call["subscription"]))
    return await on_leader(call, create)


@routes.add("DELETE", TOPIC_URL + "/subscriptions/{subscription}",
            summary="Delete a subscription: its consumers are unregistered and every segment drops it.",
            params=(*TOPIC_PATH, SUB), replies={204: DONE, **errors(404, 405, 412, 503)})
async def delete_scalable_subscription(call: Call) -> Any:
    async def delete(service: ScalableTopicService) -> None:
        await (await service.leader(requested_topic(call))).delete_subscription(
            subscription_name(call["subscription"]))
    return await on_leader(call, delete)


@routes.add("POST", TOPIC_URL + "/split/{segmentId}", summary="Split an active segment at the midpoint of its "
                                                                "hash range.",
            params=(*TOPIC_PATH, SEGMENT_ID), replies={204: DONE, **errors(400, 404, 409, 412, 503)})
async def split_segment(call: Call) -> Any:
    return await on_leader(call, lambda service: service.split_segment(requested_topic(call), call["segmentId"]))


@routes.add("POST", TOPIC_URL + "/merge/{segmentId1}/{segmentId2}", summary="Merge two adjacent active segments.",
            params=(*TOPIC_PATH, SEGMENT_ID1, SEGMENT_ID2), replies={204: DONE, **errors(400, 404, 409, 412, 503)})
async def merge_segments(call: Call) -> Any:
    return await on_leader(call, lambda service: service.merge_segments(
        requested_topic(call), call["segmentId1"], call["segmentId2"]))


# --- segments ---------------------------------------------------------------------------------

@routes.add("PUT", SEGMENT_URL, summary="Create a segment topic, with these subscriptions at Earliest.",
            params=(*TOPIC_PATH, DESCRIPTOR, INCARNATION), body={**STRING_LIST, "maxItems": 10_000},
            replies={204: DONE, **errors(400, 404, 405, 412)})
async def create_segment(call: Call) -> None:
    check_namespace(call)
    segment = requested_segment(call)
    subscriptions = [subscription_name(s) for s in call.body or []]
    await (await scalable(call)).segments.create(segment, subscriptions, incarnation=call["incarnation"])


@routes.add("POST", SEGMENT_URL + "/terminate", summary="Terminate (seal) a segment topic: producers get "
                                                         "TopicTerminated.",
            params=(*TOPIC_PATH, DESCRIPTOR), replies={204: DONE, **errors(404, 412)})
async def terminate_segment(call: Call) -> None:
    await (await scalable(call)).segments.terminate(requested_segment(call))


@routes.add("GET", SEGMENT_URL, summary="A segment topic's state (extension: the controller of another broker "
                                     "reads a remote segment's subscriptions and termination with it).",
            params=(*TOPIC_PATH, DESCRIPTOR), replies={200: Reply("exists, terminated, subscriptions, counters",
                                                                  {"type": "object"}), **errors(412)})
async def get_segment(call: Call) -> dict[str, Any]:
    segment = requested_segment(call)
    local = (await scalable(call)).segments
    local = getattr(local, "local", local)          # answer for this broker's own data
    stats = await local.stats(segment)
    return {"exists": bool(stats), "terminated": bool(stats.get("terminated")),
            "subscriptions": {name: {"msgBacklog": sub.get("msgBacklog", 0)}
                              for name, sub in stats.get("subscriptions", {}).items()},
            "msgInCounter": stats.get("msgInCounter", 0), "storageSize": stats.get("storageSize", 0),
            **{rate: stats.get(rate, 0.0) for rate in SEGMENT_RATES}}


@routes.add("DELETE", SEGMENT_URL + "/subscriptions/{subscription}",
            summary="Delete a subscription of a segment topic (extension: the controller deleting a "
                    "scalable topic's subscription on another broker's segments).",
            params=(*TOPIC_PATH, DESCRIPTOR, SUB), replies={204: DONE, **errors(412)})
async def delete_segment_subscription(call: Call) -> None:
    await (await scalable(call)).segments.delete_subscription(requested_segment(call),
                                                              subscription_name(call["subscription"]))


@routes.add("DELETE", SEGMENT_URL, summary="Delete a segment topic and its ledger.",
            params=(*TOPIC_PATH, DESCRIPTOR), replies={204: DONE, **errors(404, 412)})
async def delete_segment(call: Call) -> None:
    segment = requested_segment(call)
    segments = (await scalable(call)).segments
    existed = await segments.exists(segment)
    # an absent segment too: the fenced delete forgets its owner record under this broker's
    # lock (a create of it may be in flight here) or refuses as the metadata store says
    await segments.delete(segment)
    if not existed:
        raise AdminError(NOT_FOUND, f"segment topic {segment} does not exist")
