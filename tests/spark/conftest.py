"""One Spark session (local[2]) for every Spark test of the run: starting one costs seconds.

Also the transactional workload the tests read, written once through the embedded broker.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.spark.workload import Workload, write_workload


@pytest.fixture(scope="session")
def spark():
    import spark_udfs

    session = spark_udfs.session("local[2]", app_name="pyengine-tests", conf={
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        # The JIT's C1 only: a test session's JVM is short-lived and its queries tiny, and on a
        # busy 2-core machine C2 compiling Spark's planner costs more than it gains (measured:
        # session start plus the first queries about 4 s faster).
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
    })
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def workload(tmp_path_factory) -> Workload:
    """The broker is closed when this returns: open transactions stay open in the data dir."""
    return asyncio.run(write_workload(tmp_path_factory.mktemp("spark") / "data", seed=20261122))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Under pytest-xdist (`--dist loadgroup`), every Spark test runs in one worker: one JVM and
    one workload for the run, not one per worker. First, so that the group is there when
    xdist's own implementation of this hook reads it."""
    here = __file__.rsplit("/", 1)[0]
    for item in items:
        if str(item.path).startswith(here + "/"):
            item.add_marker(pytest.mark.xdist_group("spark"))
