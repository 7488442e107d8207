import pytest

from pyengine.storage import StorageEnvironment


@pytest.fixture
def env(tmp_path):
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
