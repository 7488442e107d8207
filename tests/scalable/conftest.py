"""Fixtures: an embedded broker (the segment topics), a memory metadata store, and scalable
topic services standing in for brokers that share the store."""

import pytest

from pyengine.broker import Broker
from pyengine.metadata.memory_store import MemoryMetadataStore
from pyengine.scalable.segments import LocalSegments
from pyengine.scalable.service import ScalableTopicService

TOPIC = "topic://public/default/orders"


@pytest.fixture
async def broker(tmp_path):
    async with Broker.embedded(tmp_path) as client:
        yield client


@pytest.fixture
async def store():
    store = await MemoryMetadataStore().start()
    yield store
    await store.close()


@pytest.fixture
async def services(broker, store):
    """`make(name, **kw)`: a started ScalableTopicService for broker `name`; all closed at the end."""
    made = []

    async def make(name, **kwargs):
        kwargs.setdefault("session_ttl", 0.5)
        url = f"pulsar://{name}:6650"
        service = await ScalableTopicService(store, LocalSegments(broker.service, url), url, **kwargs).start()
        made.append(service)
        return service

    yield make
    for service in made:
        await service.close()
