"""Requests about names that do not exist (a typo, a scan, a client looking up topics it then
never creates) each left a cache entry of the policies ("not stored") that nothing removed: the
cache grew with every name ever asked for (found by an audit). Pulsar's metadata cache expires
its entries; ours keeps what is stored, and reads a missing record again when asked."""

from __future__ import annotations

import asyncio

from pyengine.protocol import lookup

T = "/admin/v2/persistent/public/default"


async def test_missing_topics_and_namespaces_asked_for_leave_no_cache_entries(api, service):
    policies = service.policies
    assert (await api.get(T + "/warm-up/stats")).status == 404
    before = len(policies._cache)
    for i in range(20):
        assert (await api.get(f"{T}/missing-{i}/stats")).status == 404
        assert (await api.get(f"{T}/missing-{i}/partitions")).status == 404
        assert (await api.get(f"{T}/missing-{i}/messageTTL")).status == 404
        assert (await api.get(f"/admin/v2/namespaces/public/missing-{i}")).status == 404
        assert lookup.partition_count(service, f"persistent://public/default/missing-{i}") == 0
    assert len(policies._cache) <= before


async def test_a_deleted_namespace_leaves_no_cache_entry(api, service):
    before = len(service.policies._cache)
    for i in range(5):
        assert (await api.put(f"/admin/v2/namespaces/public/gone-{i}")).status == 204
        assert (await api.delete(f"/admin/v2/namespaces/public/gone-{i}")).status == 204
        assert (await api.get(f"/admin/v2/namespaces/public/gone-{i}")).status == 404
    assert len(service.policies._cache) <= before


async def test_a_record_being_deleted_reads_as_deleted_before_its_write_is_durable(api, service):
    assert (await api.put("/admin/v2/namespaces/public/going")).status == 204
    task = asyncio.ensure_future(service.policies.delete_namespace("public/going", has_topics=False))
    await asyncio.sleep(0)                                  # queued, not durable yet
    assert not service.policies.namespace_exists("public/going")
    await task
    assert not service.policies.namespace_exists("public/going")
