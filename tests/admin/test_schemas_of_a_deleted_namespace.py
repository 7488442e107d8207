"""A namespace's schemas go with it. A schema can be uploaded for a topic that does not exist
(yet), so an empty namespace may hold schemas: kept by the topics' names, they outlived the
namespace's deletion and a namespace created again under its name had them (a producer there was
checked against them). Pulsar deletes the schemas of a namespace's topics with it (#10465: with
the namespace gone, nothing would find them any more); here every schema under its name goes."""

from __future__ import annotations

import asyncio
import json

from pyengine.schema import schema_id

NS = "/admin/v2/namespaces/public/gone"
S = "/admin/v2/schemas/public/gone"
Rec = {"type": "record", "name": "Rec", "fields": [{"name": "a", "type": "int"}]}
AVRO = {"type": "AVRO", "schema": json.dumps(Rec)}


async def test_a_namespace_created_again_has_none_of_the_deleted_ones_schemas(api, service):
    assert (await api.put(NS)).status == 204
    assert (await api.put("/admin/v2/namespaces/public/gone2")).status == 204
    for topic in ("t", "u"):
        assert (await api.post(f"{S}/{topic}/schema", AVRO)).status == 200
    assert (await api.post("/admin/v2/schemas/public/gone2/t/schema", AVRO)).status == 200
    assert (await api.delete(NS)).status == 204
    assert (await api.put(NS)).status == 204
    for topic in ("t", "u"):
        reply = await api.get(f"{S}/{topic}/schema")
        assert (reply.status, reply.body) == (404, {"reason": "Schema not found"})
    assert service.schemas.registry.versions(schema_id("persistent://public/gone/t")) == []
    # As stored, not only as cached; another namespace whose name starts the same keeps its own.
    service.schemas.registry._cache.clear()
    assert service.schemas.registry.versions(schema_id("persistent://public/gone/t")) == []
    assert (await api.get("/admin/v2/schemas/public/gone2/t/schema")).status == 200


async def test_a_schema_uploaded_while_the_namespace_is_deleted_goes_with_it(api, service, monkeypatch):
    assert (await api.put(NS)).status == 204
    registry = service.schemas.registry
    started, release = asyncio.Event(), asyncio.Event()
    store = registry._store

    async def held_store(sid, versions):            # the upload is checked, its write held
        started.set()
        await release.wait()
        await store(sid, versions)

    deleted = asyncio.Event()
    delete_namespace = service.policies.delete_namespace

    async def noted_delete_namespace(*args, **kwargs):
        await delete_namespace(*args, **kwargs)
        deleted.set()

    monkeypatch.setattr(registry, "_store", held_store)
    monkeypatch.setattr(service.policies, "delete_namespace", noted_delete_namespace)
    upload = asyncio.ensure_future(api.post(f"{S}/t/schema", AVRO))
    await started.wait()
    delete = asyncio.ensure_future(api.delete(NS))
    await deleted.wait()                            # the namespace is gone, the upload not written yet
    release.set()
    assert (await upload).status == 200
    assert (await delete).status == 204
    assert (await api.put(NS)).status == 204
    registry._cache.clear()
    assert (await api.get(f"{S}/t/schema")).status == 404
