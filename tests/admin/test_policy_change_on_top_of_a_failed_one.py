"""A policy change made while an earlier change of the same record was being written starts
from that earlier change (the cache holds it before it is durable). When the earlier write
failed, its caller was told so, yet the later write stored its change all the same: a change
refused with an error was in force (found by an audit). The later write now fails with it."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

from pyengine.storage.errors import StorageError

TOPIC = "persistent://public/default/stacked"
NS = "public/default"


def fail_commit_when_told(env) -> tuple[threading.Event, threading.Event]:
    """The next group commit of `env` waits (in its writer thread) for `go`, then fails."""
    sealed, go = threading.Event(), threading.Event()
    original = env._write_batch

    def failing(writes):
        env._write_batch = original
        sealed.set()
        go.wait(5)
        raise OSError("injected write failure")

    env._write_batch = failing
    return sealed, go


async def _stacked(service, first, second):
    sealed, go = fail_commit_when_told(service.env)
    one = asyncio.ensure_future(first())
    await asyncio.to_thread(sealed.wait, 5)            # its commit is being written (and will fail)
    two = asyncio.ensure_future(second())
    await asyncio.sleep(0)                              # read, changed and queued on top of it
    go.set()
    return await asyncio.gather(one, two, return_exceptions=True)


async def test_a_topic_policy_change_on_top_of_a_failed_one_does_not_store_it(service):
    policies = service.policies
    one, two = await _stacked(service, lambda: policies.set_topic_policy(TOPIC, "messageTTLInSeconds", 5),
                              lambda: policies.set_topic_policy(TOPIC, "maxProducerPerTopic", 4))
    assert isinstance(one, StorageError) and isinstance(two, StorageError)   # both refused
    assert policies.topic_policies(TOPIC) == {}
    policies._cache.clear()
    assert policies.topic_policies(TOPIC) == {}           # nor stored: not in force
    await policies.set_topic_policy(TOPIC, "maxProducerPerTopic", 3)     # the record is usable again
    policies._cache.clear()
    assert policies.topic_policies(TOPIC) == {"maxProducerPerTopic": 3}


async def test_a_namespace_policy_change_on_top_of_a_failed_one_does_not_store_it(service):
    policies = service.policies

    async def change(**fields):
        await policies.set_policies(NS, dataclasses.replace(policies.policies(NS), **fields))

    one, two = await _stacked(service, lambda: change(message_ttl_seconds=5), lambda: change(max_producers_per_topic=4))
    assert isinstance(one, StorageError) and isinstance(two, StorageError)
    for cached in (True, False):
        if not cached:
            policies._cache.clear()
        assert (policies.policies(NS).message_ttl_seconds, policies.policies(NS).max_producers_per_topic) == (None, None)
    assert not policies._writing


async def test_a_change_whose_caller_stopped_waiting_and_whose_write_failed_is_not_in_force(service):
    """E.g. an admin request cancelled while its write was under way: the cache kept its value."""
    policies = service.policies
    sealed, go = fail_commit_when_told(service.env)
    change = asyncio.ensure_future(policies.set_topic_policy(TOPIC, "messageTTLInSeconds", 5))
    await asyncio.to_thread(sealed.wait, 5)
    change.cancel()
    go.set()
    await asyncio.gather(change, return_exceptions=True)
    await asyncio.gather(service.env.barrier(), return_exceptions=True)     # the failed commit is settled
    assert policies.topic_policies(TOPIC) == {}
