"""One Spark session (local[2]) for every Spark test of the run: starting one costs seconds.

Also the transactional workload the tests read, written once through the embedded broker.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import sys
from pathlib import Path

import pytest

from tests.spark.workload import Workload, write_workload


def worker_python(directory: Path) -> str:
    """This interpreter for Spark's Python workers, importing pyspark from its installed package
    (bytecode compiled once and cached) instead of from the pyspark.zip that Spark puts first on
    a worker's PYTHONPATH, which every worker compiles anew: ~2 s of CPU against ~0.6 s. Spark
    gives a worker 10 s to connect back (PythonWorkerFactory, not configurable); each reader's
    planning and each streaming source starts one, and on a loaded machine those 2 s outlasted
    it ("Python worker failed to connect back"). The same pyspark, from the same wheel."""
    script = directory / "python"
    script.write_text("#!/bin/sh\n"
                      "PYTHONPATH=$(printf '%s' \"$PYTHONPATH\" | tr ':' '\\n' | grep -v '/pyspark/python/lib/'"
                      " | paste -sd: -)\n"
                      "export PYTHONPATH\n"
                      f"exec {shlex.quote(sys.executable)} \"$@\"\n")
    script.chmod(0o755)
    return str(script)


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    import spark_udfs

    # Read once, when the context starts (SparkContext.pythonExec): the variable is then restored.
    chosen = os.environ.get("PYSPARK_PYTHON")
    os.environ["PYSPARK_PYTHON"] = worker_python(tmp_path_factory.mktemp("spark-python"))
    try:
        session = _session(spark_udfs)
    finally:
        if chosen is None:
            del os.environ["PYSPARK_PYTHON"]
        else:
            os.environ["PYSPARK_PYTHON"] = chosen
    yield session
    session.stop()


def _session(spark_udfs):
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
    return session


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
