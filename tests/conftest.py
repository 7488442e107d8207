"""Suite-wide settings and the fixtures many test packages share."""

import pytest
from hypothesis import HealthCheck, settings

from pyengine.metadata.etcd_server import EtcdUnavailableError, LocalEtcd
from pyengine.storage import StorageEnvironment

# Timing is not what these properties check, and the machines that run them are shared and
# noisy: no per-example deadline (a slow example is still reported by --durations).
settings.register_profile("pyengine", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("pyengine")


@pytest.fixture
def env(tmp_path):
    """A fresh storage environment in a temporary data dir."""
    environment = StorageEnvironment(tmp_path / "data")
    yield environment
    environment.close()


@pytest.fixture
def reopen(tmp_path):
    """Close an environment and open the same data dir again (a clean restart)."""
    opened = []

    def _reopen(environment: StorageEnvironment | None = None, **kwargs) -> StorageEnvironment:
        if environment is not None:
            environment.close()
        fresh = StorageEnvironment(tmp_path / "data", **kwargs)
        opened.append(fresh)
        return fresh

    yield _reopen
    for environment in opened:
        environment.close()


@pytest.fixture
def own_etcd(tmp_path):
    """An etcd of the test's own, for tests that restart, compact or
    share it between processes (server-wide), stopped at the test's end."""
    server = LocalEtcd(tmp_path / "etcd")
    try:
        server.start()
    except EtcdUnavailableError as exc:
        pytest.fail(f"this test needs a local etcd: {exc}", pytrace=False)
    yield server
    server.stop()
