"""A tenant exists until its deletion is written, as Pulsar's until its node is deleted: a
creation meanwhile is refused with 409 (the deletion may yet fail, and the tenant be back)."""

from __future__ import annotations

import asyncio
import threading

from tests.admin.test_schemas_of_a_deleted_namespace import commits_held

T = "/admin/v2/tenants/gone"
INFO = {"allowedClusters": ["standalone"], "adminRoles": []}


async def in_flight(service, tenant):
    """Until the tenant's deletion is submitted (the cache says gone, the store not yet)."""
    key = f"/admin/tenants/{tenant}"
    while not (key in service.policies._writing and service.policies._cache.get(key, 0) is None):
        await asyncio.sleep(0.005)


async def test_a_tenant_is_not_created_again_while_its_deletion_is_written(api, service):
    assert (await api.put(T, INFO)).status == 204
    with commits_held(service):
        delete = asyncio.ensure_future(api.delete(T))
        await in_flight(service, "gone")
        again = await api.put(T, {**INFO, "adminRoles": ["new"]})
    assert (again.status, again.body) == (409, {"reason": "tenant gone already exists"})
    assert (await delete).status == 204
    assert (await api.get(T)).status == 404
    assert (await api.put(T, INFO)).status == 204           # once the deletion is written
    assert (await api.get(T)).body == INFO


async def test_a_tenant_whose_deletion_failed_is_still_there(api, service):
    """The 409 was right: a failed deletion leaves the tenant as it was."""
    assert (await api.put(T, INFO)).status == 204
    release, write_batch = threading.Event(), service.env._write_batch

    def failing(writes):
        release.wait(5)         # (a safety net: released below)
        raise OSError("disk full")

    service.env._write_batch = failing
    try:
        delete = asyncio.ensure_future(api.delete(T))
        await in_flight(service, "gone")
        assert (await api.put(T, {**INFO, "adminRoles": ["new"]})).status == 409
    finally:
        release.set()
    assert (await delete).status == 500
    service.env._write_batch = write_batch
    assert (await api.get(T)).body == INFO
