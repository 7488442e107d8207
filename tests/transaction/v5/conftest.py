"""Fixtures of the v5 (PIP-473) transaction tests: the coordinator, the header cache and the
participants over one metadata store, on every backend (memory, lmdb, a real loopback etcd:
the metadata-store tests' fixtures)."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from pyengine.metadata import MetadataStore
from pyengine.metadata.lmdb_store import LmdbMetadataStore
from pyengine.storage import ManagedLedger, StorageEnvironment
from pyengine.transaction.buffer.metadata_buffer import MetadataTransactionBuffer
from pyengine.transaction.coordinator.metadata_coordinator import MetadataTransactionCoordinator
from pyengine.transaction.coordinator.metadata_headers import TxnHeaderCache
from pyengine.transaction.coordinator.metadata_metrics import V5Metrics
from tests.metadata.conftest import Backend, backend, backend_name, etcd_server  # noqa: F401  (fixtures)

SEGMENT = "segment://public/default/v5/0000-ffff-0"
_dirs = itertools.count()


class Clock:
    """Milliseconds, moved by tests."""

    def __init__(self, now: int = 1_700_000_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class V5:
    """One broker's v5 side: data env, metadata store, header cache, coordinator."""

    def __init__(self, backend: Backend, tmp_path, clock: Clock) -> None:
        self.backend = backend
        self.tmp_path = tmp_path
        self.clock = clock
        self.env: StorageEnvironment | None = None
        self.store: MetadataStore | None = None
        self.metrics = V5Metrics()
        self.headers: TxnHeaderCache | None = None
        self.coordinator: MetadataTransactionCoordinator | None = None
        self.ledgers: list[ManagedLedger] = []
        self.buffers: list[MetadataTransactionBuffer] = []

    async def start(self, *, data_dir=None, store: MetadataStore | None = None, recheck_interval_s: float = 0.05,
                    retention_ms: int = 1000) -> V5:
        """Start (again: pass the previous `data_dir`, and on memory/etcd the previous `store`)."""
        self.data_dir = data_dir or self.tmp_path / f"data{next(_dirs)}"
        self.env = StorageEnvironment(self.data_dir, sync=False)
        if self.backend.name == "lmdb":
            self.store = LmdbMetadataStore(self.env)      # the broker's layout: one data dir
        else:
            self.store = store or self.backend.new()
        await self.store.start()
        self.headers = await TxnHeaderCache(self.store, clock=self.clock,
                                            recheck_interval_s=recheck_interval_s).start()
        self.coordinator = MetadataTransactionCoordinator(self.store, clock=self.clock, retention_ms=retention_ms,
                                                          metrics=self.metrics)
        await self.coordinator.start(sweep=False)
        return self

    async def buffer(self, segment: str = SEGMENT, config=None) -> tuple[ManagedLedger, MetadataTransactionBuffer]:
        ledger = await ManagedLedger.open(self.env, segment, config)
        buffer = MetadataTransactionBuffer(ledger, self.store, self.headers, metrics=self.metrics)
        await buffer.recover()
        self.ledgers.append(ledger)
        self.buffers.append(buffer)
        return ledger, buffer

    async def restart(self) -> V5:
        data_dir, store = self.data_dir, self.store
        await self.stop()
        return await self.start(data_dir=data_dir, store=store)

    async def stop(self) -> None:
        for buffer in self.buffers:
            await buffer.close()
        for ledger in self.ledgers:
            await ledger.close()
        self.buffers, self.ledgers = [], []
        if self.coordinator is not None:
            await self.coordinator.close()
        if self.headers is not None:
            await self.headers.close()
        self.coordinator = self.headers = None
        if self.store is not None and self.backend.name == "lmdb":
            await self.store.close()
        if self.env is not None:
            await self.env.drain()
            self.env.close()
            self.env = None


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
async def v5(backend, tmp_path, clock):
    side = V5(backend, tmp_path, clock)
    await side.start()
    yield side
    await side.stop()


async def eventually(predicate, timeout: float = 5.0, interval: float = 0.005):
    """Wait until `predicate()` is true (watch-driven state arrives asynchronously)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"not true after {timeout} s: {predicate}")
        await asyncio.sleep(interval)


class Gate:
    """Holds the calls that go through `wrap` until released (an interleaving made certain)."""

    def __init__(self) -> None:
        self.held, self.released = asyncio.Event(), asyncio.Event()

    def wrap(self, call, holds=lambda *args: True):
        async def held(*args, **kwargs):
            if holds(*args):
                self.held.set()
                await self.released.wait()
            return await call(*args, **kwargs)
        return held
