"""A Spark session that can run the pipeline, and registration of the data source."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping

from pyspark.sql import DataFrame, SparkSession

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"

# What the pipeline needs in any session (`register` sets the first; `session` all).
DEFAULT_CONF = {
    PUSHDOWN_CONF: "true",
    # Bigger Arrow batches between the JVM and Python workers: fewer round trips per row.
    "spark.sql.execution.arrow.maxRecordsPerBatch": "65536",
}


def use_this_python() -> None:
    """Python workers run the interpreter on PATH unless told otherwise, which may lack
    pyarrow and the native kernels: point them at this one when the user has not chosen
    (a variable set but empty counts as not chosen: Spark could not start workers with it)."""
    for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
        if not os.environ.get(name, "").strip():
            os.environ[name] = sys.executable


def register(spark: SparkSession) -> SparkSession:
    """Register the `pyengine` format with `spark` (idempotent) and turn on Python filter
    push-down, which the data source implements (Spark refuses such a reader otherwise)."""
    from spark_udfs.source import PyengineDataSource

    spark.conf.set(PUSHDOWN_CONF, "true")
    spark.dataSource.register(PyengineDataSource)
    return spark


def session(master: str | None = "local[*]", app_name: str = "pyengine", conf: Mapping[str, str] | None = None,
            ) -> SparkSession:
    """Get or create a Spark session ready for the pipeline, with the data source registered.

    `master` is `local[*]` by default, or any cluster URL (`spark://...`, `yarn`, `k8s://...`;
    None leaves it to spark-submit). Local sessions bind the driver to 127.0.0.1.
    """
    use_this_python()
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    settings = dict(DEFAULT_CONF)
    if master is not None and master.startswith("local"):
        settings.update({"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    return register(builder.getOrCreate())


def read(spark: SparkSession, data_dir: str, *, topics: str | list[str] | None = None,
         isolation: str = "read_committed", **options: object) -> DataFrame:
    """`spark.read.format("pyengine")` with its options as arguments (list of topics allowed)."""
    reader = spark.read.format("pyengine").option("isolation", isolation)
    if topics is not None:
        # A list as JSON (which the option reads back as a list): a topic's local name may hold a
        # comma, which a comma-joined list would split into other topics.
        reader = reader.option("topics", topics if isinstance(topics, str) else json.dumps(list(topics)))
    for key, value in options.items():
        reader = reader.option(key, str(value).lower() if isinstance(value, bool) else str(value))
    return reader.load(str(data_dir))


__all__ = ["DEFAULT_CONF", "PUSHDOWN_CONF", "read", "register", "session", "use_this_python"]
