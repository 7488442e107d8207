"""`spark_udfs.session` and `use_this_python` without starting a JVM: the builder is a fake
that records what `session()` asks of it."""

from __future__ import annotations

import importlib
import os
import sys

import pytest

from spark_udfs.session import DEFAULT_CONF, PUSHDOWN_CONF, use_this_python

session_module = importlib.import_module("spark_udfs.session")      # `spark_udfs.session` is the function
PYTHON_VARS = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")


class FakeSpark:
    """What `register` touches of a session."""

    def __init__(self) -> None:
        self.conf_set: dict[str, str] = {}
        self.registered: list[type] = []
        self.conf = type("Conf", (), {"set": lambda _, key, value: self.conf_set.__setitem__(key, value)})()
        self.dataSource = type("Sources", (), {"register": lambda _, source: self.registered.append(source)})()


class FakeBuilder:
    def __init__(self) -> None:
        self.calls: dict[str, object] = {"conf": {}}
        self.spark = FakeSpark()

    def appName(self, name: str) -> FakeBuilder:
        self.calls["appName"] = name
        return self

    def master(self, master: str) -> FakeBuilder:
        self.calls["master"] = master
        return self

    def config(self, key: str, value: str) -> FakeBuilder:
        self.calls["conf"][key] = value
        return self

    def getOrCreate(self) -> FakeSpark:
        return self.spark


@pytest.fixture
def builder(monkeypatch) -> FakeBuilder:
    fake = FakeBuilder()
    monkeypatch.setattr(session_module, "SparkSession", type("SparkSession", (), {"builder": fake}))
    for name in PYTHON_VARS:
        monkeypatch.delenv(name, raising=False)
    return fake


def test_use_this_python_points_workers_here_only_when_the_user_has_not(monkeypatch):
    for name in PYTHON_VARS:
        monkeypatch.delenv(name, raising=False)
    use_this_python()
    assert [os.environ[name] for name in PYTHON_VARS] == [sys.executable] * 2
    # The user's own choice stays, each variable on its own; an empty one counts as unset.
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/env/bin/python")
    monkeypatch.setenv("PYSPARK_DRIVER_PYTHON", "")
    use_this_python()
    assert [os.environ[name] for name in PYTHON_VARS] == ["/opt/env/bin/python", sys.executable]
    monkeypatch.setenv("PYSPARK_DRIVER_PYTHON", "ipython")
    use_this_python()
    assert [os.environ[name] for name in PYTHON_VARS] == ["/opt/env/bin/python", "ipython"]


def test_session_defaults_to_local_all_cores_on_this_python(builder):
    spark = session_module.session()
    assert builder.calls["master"] == "local[*]" and builder.calls["appName"] == "pyengine"
    assert builder.calls["conf"] == {**DEFAULT_CONF, "spark.driver.host": "127.0.0.1",
                                     "spark.driver.bindAddress": "127.0.0.1"}
    assert [os.environ[name] for name in PYTHON_VARS] == [sys.executable] * 2
    # Registered, with push-down on (the reader implements it: Spark refuses it otherwise).
    assert spark.conf_set == {PUSHDOWN_CONF: "true"} and [s.name() for s in spark.registered] == ["pyengine"]


def test_session_keeps_the_users_python_master_and_conf(builder, monkeypatch):
    monkeypatch.setenv("PYSPARK_PYTHON", "./environment/bin/python")
    batch = "spark.sql.execution.arrow.maxRecordsPerBatch"
    session_module.session("spark://head:7077", app_name="etl", conf={batch: "1024"})
    assert builder.calls["master"] == "spark://head:7077" and builder.calls["appName"] == "etl"
    # A cluster's driver is not bound to 127.0.0.1; the user's conf wins over the defaults.
    assert batch in DEFAULT_CONF and builder.calls["conf"] == {**DEFAULT_CONF, batch: "1024"}
    assert os.environ["PYSPARK_PYTHON"] == "./environment/bin/python"


def test_session_without_a_master_leaves_it_to_spark_submit(builder):
    session_module.session(None)
    assert "master" not in builder.calls and "spark.driver.host" not in builder.calls["conf"]
