"""Policy changes made at the same time are all kept (found by an audit): every setter read the
cached record, changed one field and awaited its write, and the cache took the new record only
once durable, so a second change made during the first write started from the record before it
and overwrote it. Each answered 204, one was silently gone. Pulsar updates Policies and
TopicPolicies read-modify-write under a version check."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.storage.errors import StorageError

NS = "/admin/v2/namespaces/public/default"
P = "/admin/v2/persistent/public/default/concurrent"


async def test_namespace_policy_changes_made_at_once_are_all_kept(api):
    replies = await asyncio.gather(api.post(NS + "/messageTTL", 30), api.post(NS + "/deduplication", True),
                                   api.post(NS + "/maxProducersPerTopic", 4),
                                   api.post(NS + "/backlogQuota", {"limitSize": 1 << 30, "policy": "producer_request_hold"}))
    assert [r.status for r in replies] == [204] * 4
    policies = (await api.get(NS)).body
    assert (policies["message_ttl_in_seconds"], policies["deduplicationEnabled"],
            policies["max_producers_per_topic"]) == (30, True, 4)
    assert policies["backlog_quota_map"]["destination_storage"]["limitSize"] == 1 << 30


async def test_topic_policy_changes_made_at_once_are_all_kept(api):
    assert (await api.put(P)).status == 204
    replies = await asyncio.gather(api.post(P + "/messageTTL?messageTTL=30"), api.post(P + "/deduplicationEnabled", True),
                                   api.post(P + "/maxProducers", 4))
    assert [r.status for r in replies] == [204] * 3
    got = [(await api.get(P + path)).body for path in ("/messageTTL", "/deduplicationEnabled", "/maxProducers")]
    assert got == [30, True, 4]


async def test_a_change_whose_write_fails_is_not_kept(api, service, monkeypatch):
    assert (await api.post(NS + "/messageTTL", 30)).status == 204

    def failing(*args, **kwargs):
        raise StorageError("disk full")

    monkeypatch.setattr(service.policies.env, "submit", failing)
    with pytest.raises(StorageError):
        await service.policies.set_topic_policy("persistent://public/default/x", "messageTTL", 5)
    assert service.policies.topic_policies("persistent://public/default/x") == {}
    monkeypatch.undo()
    assert (await api.get(NS + "/messageTTL")).body == 30
