"""Tenants, namespaces and partitioned topics are listed from the store, while their creation
is in force (cached) as soon as it is made: a tenant was deleted as empty while one of its
namespaces was being created, which was left in a deleted tenant (found by an audit). A
creation under way is now listed (a deletion under way still is too, until it is durable)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from pyengine.broker.policies import ConflictError


def hold_commits(env) -> tuple[threading.Event, threading.Event]:
    """The next group commit of `env` waits (in its writer thread) until `go` is set."""
    sealed, go = threading.Event(), threading.Event()
    original = env._write_batch

    def held(writes):
        env._write_batch = original
        sealed.set()
        go.wait(5)
        return original(writes)

    env._write_batch = held
    return sealed, go


async def test_a_tenant_whose_namespace_is_being_created_is_not_deleted(service):
    policies = service.policies
    await policies.create_tenant("busy")
    sealed, go = hold_commits(service.env)
    create = asyncio.ensure_future(policies.create_namespace("busy/ns"))
    await asyncio.to_thread(sealed.wait, 5)             # being written, not durable yet
    try:
        with pytest.raises(ConflictError):
            await policies.delete_tenant("busy")
        assert policies.namespaces("busy") == ["busy/ns"]
    finally:
        go.set()
    await create
    assert policies.tenant("busy") and policies.namespaces("busy") == ["busy/ns"]


async def test_tenants_and_partitioned_topics_being_created_are_listed(service):
    policies = service.policies
    sealed, go = hold_commits(service.env)
    creations = asyncio.gather(policies.create_tenant("fresh"),
                               policies.create_partitioned_topic("persistent://public/default/p", 2))
    await asyncio.to_thread(sealed.wait, 5)
    try:
        assert "fresh" in policies.tenants()
        assert policies.partitioned_topics("public/default") == ["persistent://public/default/p"]
    finally:
        go.set()
    await creations
    assert "fresh" in policies.tenants()
