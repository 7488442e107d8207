"""A namespace with scalable topics is not empty, as in Pulsar: deleting it is refused with 409,
also when none of their segments is stored on this broker (on another broker, or not created
yet: their layout is written first). Deleted, it took their schemas and left their layouts."""

from __future__ import annotations

from pyengine.metadata.memory_store import MemoryMetadataStore
from tests.admin.conftest import restartable_broker

NS = "/admin/v2/namespaces/public/sc"
S = "/admin/v2/scalable/public/sc"
SCHEMA = {"type": "STRING", "schema": "", "properties": {}}
REFUSED = (409, {"reason": "namespace public/sc still has topics"})


async def test_a_scalable_topic_whose_segments_are_not_created_yet(api, service):
    """The crash window of `create_topic`: the layout is written, its segments are not."""
    assert (await api.put(NS)).status == 204
    scalable = await service.scalable_topics()

    async def not_yet(*args, **kwargs):
        pass
    scalable.segments.create = not_yet
    assert (await api.put(f"{S}/orders?numInitialSegments=2")).status == 204
    assert (await api.post("/admin/v2/schemas/public/sc/orders/schema", SCHEMA)).status == 200
    assert service.list_topics("public/sc") == []
    reply = await api.delete(NS)
    assert (reply.status, reply.body) == REFUSED
    assert (await api.get("/admin/v2/schemas/public/sc/orders/schema")).status == 200
    assert (await api.delete(f"{S}/orders")).status == 204
    assert (await api.delete(NS)).status == 204


async def test_a_scalable_topic_whose_segments_are_on_another_broker(tmp_path):
    store = await MemoryMetadataStore().start()
    try:
        async with restartable_broker(tmp_path / "a", num_coordinators=1, metadata_store=store) as (a, api_a, _), \
                restartable_broker(tmp_path / "b", num_coordinators=1, metadata_store=store) as (b, api_b, _):
            a.service_url, b.service_url = "pulsar://a:6650", "pulsar://b:6650"
            a.web_service_url, b.web_service_url = api_a.url, api_b.url
            assert (await api_a.put(NS)).status == 204 and (await api_b.put(NS)).status == 204
            assert (await api_b.put(f"{S}/orders?numInitialSegments=2")).status == 204     # segments on b
            assert a.list_topics("public/sc") == [] and len(b.list_topics("public/sc")) == 2
            reply = await api_a.delete(NS)
            assert (reply.status, reply.body) == REFUSED
            assert (await api_a.get(NS)).status == 200
    finally:
        await store.close()
