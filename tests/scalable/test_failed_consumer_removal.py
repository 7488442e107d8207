"""A consumer's removal (an eviction at the end of its grace period, or an unregistration) whose
metadata-store write fails leaves the coordinator's memory as the store has it, and is retried.
Found by an audit: the consumer was forgotten in memory before its record was deleted, so a
failed delete left its record (and segments) in the store with nobody evicting it again — its
segments were read by no one, and the same name registering again was refused by the store
(the record exists) and made the controller step down. And once the record was deleted, a
failed rebalance left the removed consumer's segments to no one until some other change."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.metadata import MetadataStoreError
from pyengine.scalable.service import scalable_topic_name
from tests.scalable.conftest import TOPIC

NAME = scalable_topic_name(TOPIC)


def fail_once(monkeypatch, resources, method: str) -> list[MetadataStoreError]:
    """`resources.method` fails once (the store unreachable); the failure left, if not used."""
    original, failures = getattr(resources, method), [MetadataStoreError(f"{method}: etcd is unreachable (once)")]

    async def flaky(*args, **kwargs):
        if failures:
            raise failures.pop()
        return await original(*args, **kwargs)
    monkeypatch.setattr(resources, method, flaky)
    return failures


async def stored(service) -> list[tuple[str, list[int]]]:
    return [(r.consumer_name, r.segment_ids) for r in await service.resources.consumers(NAME, "s")]


async def eventually(check, what: str, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await check():
        assert loop.time() < deadline, what
        await asyncio.sleep(0.02)


async def two_consumers(services, **kwargs):
    service = await services("a", **kwargs)
    await service.create_topic(TOPIC, 2)
    controller = await service.controller(TOPIC)
    pushed: list[list[int]] = []
    await controller.register_consumer("s", "c1", 1, 
                                     lambda a: pushed.append(getattr(a, "segment_ids", a)))
    await controller.register_consumer("s", "c2", 2)
    assert await stored(service) == [("c1", [0]), ("c2", [1])]
    return service, controller, pushed


async def test_an_eviction_whose_delete_fails_is_retried(services, monkeypatch):
    service, controller, pushed = await two_consumers(services, grace_period=0.1)
    failures = fail_once(monkeypatch, service.resources, "delete_consumer")
    controller.consumer_disconnected("s", "c2")

    async def evicted():
        return await stored(service) == [("c1", [0, 1])]
    await eventually(evicted, "c2 was never evicted after its failed delete: its segment is read by no one")
    assert not failures
    assert list(controller.subscriptions["s"].consumers) == ["c1"]
    assert pushed[-1] == [0, 1]


async def test_an_unregistration_whose_delete_fails_keeps_the_session(services, monkeypatch):
    service, controller, pushed = await two_consumers(services, grace_period=0.1)
    fail_once(monkeypatch, service.resources, "delete_consumer")
    with pytest.raises(MetadataStoreError):
        await controller.unregister_consumer("s", "c2")
    # the record stayed: so does the session, until its grace period evicts it ...
    assert "c2" in controller.subscriptions["s"].consumers
    # ... and the consumer may register again under its name meanwhile (it resumes its session)
    assignment = await controller.register_consumer("s", "c2", 3)
    assert assignment.segment_ids == [1] and controller.is_leader
    assert await stored(service) == [("c1", [0]), ("c2", [1])]


async def test_a_rebalance_that_fails_after_a_removal_is_retried(services, monkeypatch):
    service, controller, pushed = await two_consumers(services)
    failures = fail_once(monkeypatch, service.resources, "save_consumer")
    with pytest.raises(MetadataStoreError):
        await controller.unregister_consumer("s", "c2")      # deleted; c1's new record fails

    async def taken_over():
        return await stored(service) == [("c1", [0, 1])]
    await eventually(taken_over, "the segment of the removed consumer was left to no one")
    assert not failures and pushed[-1] == [0, 1]


async def test_a_withdrawn_registration_whose_record_was_deleted_is_not_kept(services, monkeypatch):
    """A registration whose first rebalance failed is withdrawn: its record deleted, the others'
    records put back. When putting them back fails too, a registration whose record is gone must
    not be kept as a session (nothing in the store to evict, its segments read by no one until
    its grace period ends)."""
    service = await services("a")
    await service.create_topic(TOPIC, 3)
    controller = await service.controller(TOPIC)
    await controller.register_consumer("s", "b", 1)
    await controller.register_consumer("s", "c", 2)
    assert await stored(service) == [("b", [0, 2]), ("c", [1])]
    save, calls = service.resources.save_consumer, []

    async def flaky(topic, subscription, record, **kwargs):
        calls.append(record.consumer_name)
        # "a" joining: b=[] and c=[] (what they keep) then a=[0] are stored, b=[1] fails;
        # withdrawing "a", b=[0, 2] fails
        if calls in (["b", "c", "a", "b"], ["b", "c", "a", "b", "b"]):
            raise MetadataStoreError("save_consumer: etcd is unreachable")
        return await save(topic, subscription, record, **kwargs)
    monkeypatch.setattr(service.resources, "save_consumer", flaky)
    with pytest.raises(MetadataStoreError):
        await controller.register_consumer("s", "a", 3)
    assert "a" not in controller.subscriptions["s"].consumers

    async def restored():
        return await stored(service) == [("b", [0, 2]), ("c", [1])]
    await eventually(restored, "the segment of the withdrawn registration was left to no one")
