"""A DAG watch session whose first read fails (the metadata store unreachable) leaves no watch
behind. Found by an audit: the store's watch, registered before the read, stayed open for good
(the session that owned it was never returned, so nothing could close it) — one more leaked
store watch per failed lookup, each fed every change of the topic."""

from __future__ import annotations

import pytest

from pyengine.metadata import MetadataStoreError
from pyengine.scalable.resources import ScalableTopicResources
from pyengine.scalable.service import scalable_topic_name
from pyengine.scalable.watch import DagWatchSession
from tests.scalable.conftest import TOPIC


async def test_a_failed_first_read_closes_the_watch(services, store, monkeypatch):
    a = await services("a")
    await a.create_topic(TOPIC, 1)
    resources = ScalableTopicResources(store)
    load, failures = resources.load, [MetadataStoreError("load: etcd is unreachable (once)")]

    async def flaky(*args, **kwargs):
        if failures:
            raise failures.pop()
        return await load(*args, **kwargs)
    monkeypatch.setattr(resources, "load", flaky)
    watches = len(store._watches)
    session = DagWatchSession(resources, scalable_topic_name(TOPIC), lambda *update: None, lambda error: None)
    with pytest.raises(MetadataStoreError):
        await session.start()
    assert not failures
    assert len(store._watches) == watches
