"""One `pyengine serve` child process per test module, on loopback, and official-client helpers."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pulsar
import pytest

from pyengine.testing import ServeProcess, serving

# The C++ client logs every connection at INFO; only its errors are worth reading in a test.
QUIET = logging.getLogger("pulsar-client")
QUIET.setLevel(logging.ERROR)
# A Failover switch waits this long before the new active consumer is served (Pulsar's default,
# 1000 ms, would slow every test that switches).
FAILOVER_DELAY_MS = 400


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    with serving(tmp_path_factory.mktemp("interop") / "data", "--num-coordinators", "2",
                 "--active-consumer-failover-delay-time-ms", str(FAILOVER_DELAY_MS)) as process:
        yield process


@pytest.fixture
def official(broker: ServeProcess) -> Iterator[pulsar.Client]:
    """An official `pulsar-client` Client on the module's broker, closed after the test."""
    client = pulsar.Client(broker.url, logger=QUIET, operation_timeout_seconds=10)
    try:
        yield client
    finally:
        client.close()
