"""A namespace's schemas go with it. A schema can be uploaded for a topic that does not exist
(yet), so an empty namespace may hold schemas: kept by the topics' names, they outlived the
namespace's deletion and a namespace created again under its name had them (a producer there was
checked against them). Pulsar deletes the schemas of a namespace's topics with it (#10465: with
the namespace gone, nothing would find them any more); here every schema under its name goes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading

from pyengine.admin import routes_namespaces
from pyengine.admin.routing import Call
from pyengine.schema import CompatibilityStrategy, SchemaData, SchemaType, schema_id

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
    """The deletion waits for the upload under way (it checked the namespace before), then
    deletes its schema with the namespace."""
    assert (await api.put(NS)).status == 204
    registry = service.schemas.registry
    started, release = asyncio.Event(), asyncio.Event()
    store = registry._store

    async def held_store(sid, versions):            # the upload is checked, its write held
        started.set()
        await release.wait()
        await store(sid, versions)

    monkeypatch.setattr(registry, "_store", held_store)
    upload = asyncio.ensure_future(api.post(f"{S}/t/schema", AVRO))
    await started.wait()
    delete = asyncio.ensure_future(api.delete(NS))
    await asyncio.sleep(0.1)
    assert not delete.done()                        # waits for the upload
    assert service.policies.policies("public/gone") is not None
    release.set()
    assert (await upload).status == 200
    assert (await delete).status == 204
    assert (await api.put(NS)).status == 204
    registry._cache.clear()
    assert (await api.get(f"{S}/t/schema")).status == 404


async def test_the_schemas_go_in_the_write_that_deletes_the_namespace(api, service, monkeypatch):
    """A crash leaves both or neither: the deletion of the namespace's policies and of its
    schemas are one LMDB write. (Two writes before: a crash, or a failed second write, left the
    schemas to a namespace created again under the name.)"""
    assert (await api.put(NS)).status == 204
    assert (await api.post(f"{S}/t/schema", AVRO)).status == 200
    writes = []
    submit = service.env.submit

    def noted_submit(write, **kwargs):
        writes.append(write)
        return submit(write, **kwargs)

    monkeypatch.setattr(service.env, "submit", noted_submit)
    assert (await api.delete(NS)).status == 204
    monkeypatch.undo()
    assert len(writes) == 1
    with service.env.read() as txn:                 # both as stored
        assert txn.get(b"/admin/namespaces/public/gone", db=service.policies._db) is None
        assert txn.get(registry_key("persistent://public/gone/t"), db=service.schemas.registry._db) is None


def registry_key(topic: str) -> bytes:
    return f"/schemas/{schema_id(topic)}".encode()


@contextlib.contextmanager
def commits_held(service):
    """The writer thread holds every commit until the block ends (a deletion stays in flight)."""
    release = threading.Event()
    write_batch = service.env._write_batch

    def held(writes):
        release.wait(5)         # (a safety net: released when the block ends)
        return write_batch(writes)

    service.env._write_batch = held
    try:
        yield
    finally:
        release.set()
        service.env._write_batch = write_batch


async def in_flight(service, namespace):
    """Until the namespace's deletion is submitted (the cache says gone, the store not yet)."""
    key = f"/admin/namespaces/{namespace}"
    while not (key in service.policies._writing and service.policies._cache.get(key, 0) is None):
        await asyncio.sleep(0.005)


async def test_a_namespace_is_not_created_again_while_its_deletion_is_written(api, service):
    """As Pulsar's (the namespace exists until its policies node is deleted): 409 meanwhile.
    Accepted, the new namespace met the deleted one's schemas (cached, or on disk until the
    commit) and a schema uploaded there was stored on top of them."""
    assert (await api.put(NS)).status == 204
    assert (await api.post(f"{S}/t/schema", AVRO)).status == 200
    with commits_held(service):
        delete = asyncio.ensure_future(api.delete(NS))
        await in_flight(service, "public/gone")
        again = await api.put(NS)
    assert (again.status, again.body) == (409, {"reason": "namespace public/gone already exists"})
    assert (await delete).status == 204
    assert (await api.put(NS)).status == 204
    other = {"type": "AVRO", "schema": json.dumps({"type": "record", "name": "Other",
                                                   "fields": [{"name": "x", "type": "string"}]})}
    reply = await api.post(f"{S}/t/schema", other)        # incompatible with the deleted one's
    assert (reply.status, reply.body) == (200, {"version": {"version": 0}})
    registry = service.schemas.registry
    registry._cache.clear()
    assert [v.version for v in registry.versions(schema_id("persistent://public/gone/t"))] == [0]


async def test_a_cancelled_deletion_forgets_the_namespaces_schemas_all_the_same(service):
    """The DELETE handler cancelled while its write is in flight (the write lands, shielded):
    the deleted namespace's schemas are not left cached for a namespace created again."""
    registry, sid = service.schemas.registry, schema_id("persistent://public/gone/t")
    await service.policies.create_namespace("public/gone")
    await registry.put_if_absent(sid, SchemaData(SchemaType.AVRO, json.dumps(Rec).encode()),
                                 CompatibilityStrategy.FULL)
    with commits_held(service):
        handler = asyncio.ensure_future(routes_namespaces.delete_namespace(
            Call(service, {"tenant": "public", "namespace": "gone", "force": False}, None, None)))
        await in_flight(service, "public/gone")
        handler.cancel()
        await asyncio.gather(handler, return_exceptions=True)
    await service.env.drain()
    assert not service.policies.namespace_exists("public/gone")
    await service.policies.create_namespace("public/gone")
    assert registry.versions(sid) == []
