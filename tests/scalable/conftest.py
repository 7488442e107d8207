"""Fixtures: an embedded broker (the segment topics), a memory metadata store, and scalable
topic services standing in for brokers that share the store."""

import asyncio

import pytest

from pyengine.broker import Broker
from pyengine.client import Client
from pyengine.metadata.memory_store import MemoryMetadataStore
from pyengine.scalable.segments import LocalSegments
from pyengine.scalable.service import ScalableTopicService
from tests.protocol.conftest import server, service  # noqa: F401  (fixtures: a broker on loopback)

TOPIC = "topic://public/default/orders"
SEGMENTS_BROKER_URL = "pulsar://segments:6650"      # the embedded broker holding the segment topics


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
def session_ttl() -> float:
    """The `services` fixture's metadata session TTL. Long enough that a stalled event loop (a
    loaded CI machine) does not expire a session a test relies on; modules whose tests wait
    for a crashed broker's session to expire override it with a short one."""
    return 5.0


@pytest.fixture
async def services(broker, store, session_ttl):
    """`make(name, **kw)`: a started ScalableTopicService for broker `name`; all closed at the end.
    Their segment topics are all on the one embedded broker, which owns them (segments.py)."""
    made = []

    async def make(name, **kwargs):
        kwargs.setdefault("session_ttl", session_ttl)
        url = f"pulsar://{name}:6650"
        segments = LocalSegments(broker.service, SEGMENTS_BROKER_URL)
        service = await ScalableTopicService(store, segments, url, **kwargs).start()
        made.append(service)
        return service

    yield make
    for service in made:
        await service.close()


@pytest.fixture
def operation_timeout() -> float:
    """The `client` fixture's operation timeout (a test module may override it)."""
    return 10


@pytest.fixture
async def client(server, service, operation_timeout):
    """A pyengine.client Client of the loopback broker of `server`."""
    service.service_url = f"pulsar://127.0.0.1:{server.port}"     # as `pyengine serve` sets it
    async with Client(f"pulsar://127.0.0.1:{server.port}", operation_timeout_seconds=operation_timeout) as client:
        yield client


class Held:
    """Segment operations (or any object's) whose calls of `method` are held in flight until
    `land` is set (`first_only`: the first call alone; later ones go straight through)."""

    def __init__(self, inner, method: str, *, first_only: bool = False):
        self.inner = inner
        self.method = method
        self.first_only = first_only
        self.sent = asyncio.Event()
        self.land = asyncio.Event()

    def __getattr__(self, name):
        original = getattr(self.inner, name)
        if name != self.method:
            return original

        async def held(*args, **kwargs):
            if not (self.first_only and self.sent.is_set()):
                self.sent.set()
                await self.land.wait()
            return await original(*args, **kwargs)
        return held
