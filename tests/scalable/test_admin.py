"""The scalable-topic and segment admin REST resources, exactly as the spec's tables, with
Pulsar's statuses for each refusal and malformed input."""

from __future__ import annotations

import pytest

from pyengine.admin.server import all_routes
from tests.admin.conftest import Api, api, client, server, service  # noqa: F401  (fixtures)
from tests.broker.helpers import drain

S = "/admin/v2/scalable/public/default"
G = "/admin/v2/segments/public/default"


EXTENSIONS = {   # what a controller needs for segments on other brokers (not in the spec's tables)
    ("GET", "/admin/v2/segments/{tenant}/{namespace}/{topic}/{descriptor}"),
    ("DELETE", "/admin/v2/segments/{tenant}/{namespace}/{topic}/{descriptor}/subscriptions/{subscription}"),
}


def test_the_spec_tables_are_the_route_table():
    paths = {(r.method, r.path) for r in all_routes() if r.path.startswith(("/admin/v2/scalable", "/admin/v2/segments"))}
    assert paths - EXTENSIONS == {
        ("GET", "/admin/v2/scalable/{tenant}/{namespace}"),
        ("PUT", "/admin/v2/scalable/{tenant}/{namespace}/{topic}"),
        ("GET", "/admin/v2/scalable/{tenant}/{namespace}/{topic}"),
        ("DELETE", "/admin/v2/scalable/{tenant}/{namespace}/{topic}"),
        ("GET", "/admin/v2/scalable/{tenant}/{namespace}/{topic}/stats"),
        ("PUT", "/admin/v2/scalable/{tenant}/{namespace}/{topic}/subscriptions/{subscription}"),
        ("DELETE", "/admin/v2/scalable/{tenant}/{namespace}/{topic}/subscriptions/{subscription}"),
        ("POST", "/admin/v2/scalable/{tenant}/{namespace}/{topic}/split/{segmentId}"),
        ("POST", "/admin/v2/scalable/{tenant}/{namespace}/{topic}/merge/{segmentId1}/{segmentId2}"),
        ("PUT", "/admin/v2/segments/{tenant}/{namespace}/{topic}/{descriptor}"),
        ("POST", "/admin/v2/segments/{tenant}/{namespace}/{topic}/{descriptor}/terminate"),
        ("DELETE", "/admin/v2/segments/{tenant}/{namespace}/{topic}/{descriptor}"),
    }


async def test_scalable_topic_lifecycle(api: Api, service):
    assert (await api.put(f"{S}/orders?numInitialSegments=2", {"team": "a"})).status == 204
    assert (await api.put(f"{S}/orders")).status == 409
    assert (await api.get(S)).body == ["topic://public/default/orders"]
    metadata = (await api.get(f"{S}/orders")).body
    assert metadata["epoch"] == 0 and metadata["properties"] == {"team": "a"}
    assert metadata["segments"]["1"]["hashRange"] == {"start": 32768, "end": 65535}
    assert (await api.put(f"{S}/orders/subscriptions/sub")).status == 204
    schema = {"type": "STRING", "schema": "", "properties": {}}
    assert (await api.post("/admin/v2/schemas/public/default/orders/schema", schema)).status == 200
    assert (await api.post(f"{S}/orders/split/0")).status == 204
    assert (await api.post(f"{S}/orders/merge/3/1")).status == 204
    metadata = (await api.get(f"{S}/orders")).body
    assert metadata["epoch"] == 2 and metadata["segments"]["4"]["parentIds"] == [3, 1]
    stats = (await api.get(f"{S}/orders/stats")).body
    assert stats["activeSegmentCount"] == 2 and stats["sealedSegmentCount"] == 3
    assert stats["controllerBrokerUrl"] == service.service_url
    assert stats["segments"]["4"]["subscriptions"] == {"sub": {"msgBacklog": 0}}
    assert (await api.delete(f"{S}/orders/subscriptions/sub")).status == 204
    assert (await api.delete(f"{S}/orders/subscriptions/sub")).status == 404
    assert (await api.get("/admin/v2/schemas/public/default/orders/schema")).status == 200   # splits keep it
    assert (await api.delete(f"{S}/orders")).status == 204
    assert (await api.get(f"{S}/orders")).status == 404
    assert (await api.get("/admin/v2/schemas/public/default/orders/schema")).status == 404   # gone with it
    assert (await api.get(S)).body == []
    assert not [t for t in service.list_topics() if t.startswith("segment://")]


async def test_a_crash_during_the_delete_leaves_no_schema_to_a_topic_created_again(api: Api, service):
    """Pulsar deletes the schema before the topic's metadata: the schema went after the
    topic's record, and a crash in between left it to a topic created again under the name."""
    scalable = await service.scalable_topics()
    delete = scalable.resources.delete
    string = {"type": "STRING", "schema": "", "properties": {}}
    json_schema = {"type": "JSON", "schema": '{"type":"record","name":"R","fields":[]}', "properties": {}}
    schema_url = "/admin/v2/schemas/public/default/orders/schema"

    async def crash_after(*args):
        await delete(*args)
        raise RuntimeError("the broker died here")

    assert (await api.put(f"{S}/orders")).status == 204
    assert (await api.post(schema_url, string)).status == 200
    scalable.resources.delete = crash_after
    assert (await api.delete(f"{S}/orders")).status == 500
    assert (await api.get(f"{S}/orders")).status == 404
    assert (await api.get(schema_url)).status == 404
    assert (await api.put(f"{S}/orders")).status == 204
    assert (await api.post(schema_url, json_schema)).status == 200     # not refused as incompatible

    async def crash_before(*args):
        raise RuntimeError("the broker died here")

    scalable.resources.delete = crash_before
    assert (await api.delete(f"{S}/orders")).status == 500
    scalable.resources.delete = delete
    assert (await api.delete(f"{S}/orders")).status == 204             # the retry finishes it
    assert (await api.get(schema_url)).status == 404
    assert (await api.get(f"{S}/orders")).status == 404


async def test_split_and_merge_refusals(api: Api):
    await api.put(f"{S}/t?numInitialSegments=3")
    assert (await api.post(f"{S}/t/split/9")).status == 404             # no such segment
    assert (await api.post(f"{S}/missing/split/0")).status == 404       # no such topic
    assert (await api.post(f"{S}/t/merge/0/2")).status == 412           # not adjacent
    assert (await api.post(f"{S}/t/merge/0/0")).status == 412
    assert (await api.post(f"{S}/t/split/0")).status == 204
    assert (await api.post(f"{S}/t/split/0")).status == 412             # sealed
    assert (await api.post(f"{S}/t/split/-1")).status == 400
    assert (await api.post(f"{S}/t/split/x")).status == 400
    assert (await api.post(f"{S}/t/split/99999999999999999999")).status == 400
    assert (await api.post(f"{S}/t/merge/1")).status == 404             # no such path
    assert (await api.get(f"{S}/t/split/1")).status == 405
    assert (await api.get(f"{S}/t")).body["epoch"] == 1                  # refusals changed nothing


async def test_malformed_input(api: Api):
    assert (await api.put(f"{S}/t?numInitialSegments=0")).status == 412      # Pulsar: must be >= 1
    assert (await api.put(f"{S}/t?numInitialSegments=-5")).status == 412
    assert (await api.put(f"{S}/t?numInitialSegments=70000")).status == 400
    assert (await api.put(f"{S}/t?numInitialSegments=two")).status == 400
    assert (await api.put(f"{S}/t", raw="{not json")).status == 400
    assert (await api.put(f"{S}/t", [1, 2])).status == 400                  # properties are an object
    assert (await api.put(f"{S}/t", {"a": 1})).status == 400                # of strings
    assert (await api.put("/admin/v2/scalable/public/nowhere/t")).status == 404
    assert (await api.get("/admin/v2/scalable/public/nowhere")).status == 404
    assert (await api.put(f"{S}/%20padded")).status == 412
    assert (await api.put(f"{S}/a%2Fb")).status == 412                      # '/' in a scalable topic name
    assert (await api.get(S)).body == []
    await api.put(f"{S}/t")
    assert (await api.put(f"{S}/t/subscriptions/%20")).status == 412
    assert (await api.get(f"{S}/missing/stats")).status == 404
    assert (await api.delete(f"{S}/missing")).status == 404


async def test_segments_resource(api: Api, service, client):
    segment = "segment://public/default/raw/0000-7fff-1"
    assert (await api.put(f"{G}/raw/0000-7FFF-1", ["a", "b"])).status == 204     # hex case-insensitive
    topic = await service.get_topic(segment, create=False)
    assert sorted(topic.subscriptions) == ["a", "b"]
    producer = await client.create_producer(segment)
    await producer.send(b"m")
    consumer = await client.subscribe(segment, "a")
    assert [m.data for m in await drain(consumer)] == [b"m"]                    # cursor at Earliest
    assert (await api.post(f"{G}/raw/0000-7fff-1/terminate")).status == 204
    assert (await api.post(f"{G}/raw/0000-7fff-1/terminate")).status == 204    # idempotent
    assert topic.ledger.terminated_at is not None
    await consumer.close()
    await producer.close()
    assert (await api.delete(f"{G}/raw/0000-7fff-1")).status == 204
    assert not service.topic_exists(segment)
    assert (await api.delete(f"{G}/raw/0000-7fff-1")).status == 404
    assert (await api.post(f"{G}/raw/0000-7fff-1/terminate")).status == 404
    for bad in ("0000-7fff", "7fff-0000-1", "00000-7fff-1", "0000-7fff-01", "zzzz-7fff-1", "0000-7fff-1-2"):
        assert (await api.put(f"{G}/raw/{bad}")).status == 412, bad
    assert (await api.put(f"{G}/raw/0000-7fff-2", {"a": 1})).status == 400       # body: a list of names
    assert (await api.put(f"{G}/raw/0000-7fff-2", [""])).status == 412
    assert (await api.put(f"{G}/raw/0000-7fff-2", ["x\n"])).status == 412
    assert (await api.put("/admin/v2/segments/public/nowhere/raw/0000-7fff-2")).status == 404
    # the extensions
    await api.put(f"{G}/raw/0000-7fff-3", ["s"])
    state = (await api.get(f"{G}/raw/0000-7fff-3")).body
    assert state["exists"] is True and state["terminated"] is False and list(state["subscriptions"]) == ["s"]
    assert (await api.delete(f"{G}/raw/0000-7fff-3/subscriptions/s")).status == 204
    assert (await api.get(f"{G}/raw/0000-7fff-3")).body["subscriptions"] == {}
    assert (await api.get(f"{G}/raw/0000-7fff-9")).body["exists"] is False
    assert (await api.get(f"{G}/raw/bad")).status == 412
    assert not [t for t in service.list_topics() if t.endswith("-2")]


async def test_a_segment_create_carries_the_incarnation_it_was_made_for(api: Api):
    """The owner broker checks a forwarded create's incarnation (a controller of a topic since
    deleted and created again must not act on the new one)."""
    assert (await api.put(f"{S}/inc")).status == 204
    incarnation = (await api.get(f"{S}/inc")).body["incarnation"]
    assert isinstance(incarnation, str) and incarnation
    stale = await api.put(f"{G}/inc/0000-ffff-0?incarnation=0123abcd", ["late"])
    assert stale.status == 405 and "incarnation" in stale.body["reason"], stale      # NotAllowed, as fenced
    assert (await api.put(f"{G}/inc/0000-ffff-0?incarnation={incarnation}", ["s"])).status == 204
    assert (await api.put(f"{G}/inc/0000-ffff-0?incarnation=", ["s"])).status == 400
