"""Fixtures of the metadata-store tests: one `store` fixture over the three backends.

The etcd backend runs against a real etcd (Debian's `etcd-server`) started once per test
session on loopback with free ports and a temporary data dir, and stopped at the end. Each
test gets its own key root on it. If etcd is missing or does not start, the etcd tests fail
with the reason (they are never skipped).
"""

from __future__ import annotations

import itertools
import uuid

import pytest

from pyengine.metadata import MetadataStore
from pyengine.metadata.etcd_server import EtcdUnavailableError, LocalEtcd
from pyengine.metadata.etcd_store import EtcdMetadataStore
from pyengine.metadata.lmdb_store import LmdbMetadataStore
from pyengine.metadata.memory_store import MemoryMetadataStore
from pyengine.storage import StorageEnvironment

BACKENDS = ["memory", "lmdb", "etcd"]
_dirs = itertools.count()


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory):
    etcd = LocalEtcd(tmp_path_factory.mktemp("etcd") / "data")
    try:
        etcd.start()
    except EtcdUnavailableError as exc:
        pytest.fail(f"the etcd metadata-store tests need a local etcd: {exc}", pytrace=False)
    yield etcd
    etcd.stop()


class Backend:
    """Opens stores of one backend; closes what it opened."""

    def __init__(self, name: str, request: pytest.FixtureRequest, tmp_path) -> None:
        self.name = name
        self.tmp_path = tmp_path
        self.server = request.getfixturevalue("etcd_server") if name == "etcd" else None
        self.envs: list[StorageEnvironment] = []
        self.stores: list[MetadataStore] = []
        self.root = f"/test-{uuid.uuid4().hex[:12]}"

    def new(self, *, shared: bool = True) -> MetadataStore:
        """A new store object. `shared`: on etcd, on the same key root as the others (another
        broker of the same cluster); the local backends have one store per data set."""
        if self.name == "memory":
            store: MetadataStore = MemoryMetadataStore()
        elif self.name == "lmdb":
            env = StorageEnvironment(self.tmp_path / f"data{next(_dirs)}", sync=False)
            self.envs.append(env)
            store = LmdbMetadataStore(env)
        else:
            assert self.server is not None
            root = self.root if shared else f"/test-{uuid.uuid4().hex[:12]}"
            store = EtcdMetadataStore(self.server.host, self.server.port, root=root)
        self.stores.append(store)
        return store

    async def close(self) -> None:
        for store in self.stores:
            await store.close()
        for env in self.envs:
            env.close()


@pytest.fixture(params=BACKENDS)
def backend_name(request):
    return request.param


@pytest.fixture
async def backend(backend_name, request, tmp_path):
    b = Backend(backend_name, request, tmp_path)
    yield b
    await b.close()


@pytest.fixture
async def store(backend):
    return await backend.new().start()
