from pathlib import Path

import pytest

from pyengine.storage import StorageEnvironment
from tests.transaction.coordinator.fakes import FakeClock, RecordingParticipants


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def env(data_dir):
    environment = StorageEnvironment(data_dir)
    yield environment
    environment.close()


@pytest.fixture
def reopen(data_dir):
    """Close an environment and open the same data dir again (a clean restart)."""
    opened = []

    def _reopen(environment: StorageEnvironment | None = None, **kwargs) -> StorageEnvironment:
        if environment is not None:
            environment.close()
        fresh = StorageEnvironment(data_dir, **kwargs)
        opened.append(fresh)
        return fresh

    yield _reopen
    for environment in opened:
        environment.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def participants() -> RecordingParticipants:
    return RecordingParticipants()
