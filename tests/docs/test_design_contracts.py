"""The contracts DESIGN.md lists for outside tests, checked against a real `pyengine serve`
process where they are about it: the admin REST paths the specs name (scalable topics,
segments, transaction keys under v2 and v3, Pulsar's v3 transactions), their status codes and
JSON shapes, the metric names the specs list on `/metrics`; and, in-process, the package layout
with its interfaces at the package roots, the asyncio client API, the CLI commands, and the
quickstart / CI wiring."""

from __future__ import annotations

import inspect
import json
import os
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyengine.testing import ServeProcess

ROOT = Path(__file__).resolve().parents[2]

# (method, path) as the specs name them: PIP-468 (scalable topics, segments), the
# transaction-key fencing PIP; Pulsar's transactions resource is /admin/v3/transactions.
SPEC_PATHS = [
    ("GET", "/admin/v2/scalable/{tenant}/{namespace}"),
    ("PUT", "/admin/v2/scalable/{tenant}/{namespace}/{topic}"),
    ("GET", "/admin/v2/scalable/{tenant}/{namespace}/{topic}"),
    ("DELETE", "/admin/v2/scalable/{tenant}/{namespace}/{topic}"),
    ("GET", "/admin/v2/scalable/{tenant}/{namespace}/{topic}/stats"),
    ("PUT", "/admin/v2/scalable/{tenant}/{namespace}/{topic}/subscriptions/{subscription}"),
    ("DELETE", "/admin/v2/scalable/{tenant}/{namespace}/{topic}/subscriptions/{subscription}"),
    ("POST", "/admin/v2/scalable/{tenant}/{namespace}/{topic}/split/{segmentId}"),
    ("POST", "/admin/v2/scalable/{tenant}/{namespace}/{topic}/merge/{segmentId1}/{segmentId2}"),
    ("PUT", "/admin/v2/segments/{tenant}/{namespace}/{topic}/{descriptor}"),
    ("POST", "/admin/v2/segments/{tenant}/{namespace}/{topic}/{descriptor}/terminate"),
    ("DELETE", "/admin/v2/segments/{tenant}/{namespace}/{topic}/{descriptor}"),
    ("GET", "/admin/v2/transactions/transaction-keys"),
    ("GET", "/admin/v2/transactions/transaction-keys/{transaction_key}"),
    ("DELETE", "/admin/v2/transactions/transaction-keys/{transaction_key}"),
    ("GET", "/admin/v3/transactions/transaction-keys"),
    ("GET", "/admin/v3/transactions/transaction-keys/{transaction_key}"),
    ("DELETE", "/admin/v3/transactions/transaction-keys/{transaction_key}"),
    ("GET", "/admin/v3/transactions/coordinatorStats"),
    ("GET", "/admin/v3/transactions/transactionMetadata/{mostSigBits}/{leastSigBits}"),
    ("GET", "/admin/v3/transactions/transactionBufferStats/{tenant}/{namespace}/{topic}"),
    ("GET", "/admin/v3/transactions/pendingAckStats/{tenant}/{namespace}/{topic}/{subName}"),
    ("GET", "/admin/v3/transactions/slowTransactions/{timeout}"),
]

# The metric names the specs list (PIP-473 "Metrics", the transaction-key PIP "Metrics").
SPEC_METRICS = [
    ("pulsar_txn_metadata_store_op_writes_total", "counter"),
    ("pulsar_txn_metadata_store_header_cas_total", "counter"),
    ("pulsar_txn_metadata_store_index_query_seconds", "histogram"),
    ("pulsar_txn_metadata_store_outstanding_op_records", "gauge"),
    ("pulsar_txn_transaction_key_count", "gauge"),
    ("pulsar_txn_transaction_key_epoch", "gauge"),
    ("pulsar_txn_transaction_key_age", "summary"),
]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    process = ServeProcess(tmp_path_factory.mktemp("contracts") / "data", "--num-coordinators", "1")
    process.start()
    try:
        yield process
    finally:
        assert process.stop() == 0, process.log_tail()


def call(broker: ServeProcess, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """The status and decoded JSON body (None when empty) of one admin call; errors too."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(broker.http_url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            status, text = reply.status, reply.read()
    except urllib.error.HTTPError as error:
        status, text = error.code, error.read()
    return status, json.loads(text) if text else None


def template(path: str) -> str:
    return re.sub(r"{[^}]+}", "{}", path)


@pytest.mark.parametrize(("method", "path"), SPEC_PATHS, ids=[f"{m} {p}" for m, p in SPEC_PATHS])
def test_the_admin_paths_the_specs_name_are_in_the_served_openapi_document(broker: ServeProcess, method: str,
                                                                          path: str) -> None:
    status, document = call(broker, "GET", "/openapi.json")
    assert status == 200
    served = {(m.upper(), template(p)) for p, item in document["paths"].items() for m in item}
    assert (method, template(path)) in served


def test_a_scalable_topic_lifecycle_over_rest_with_pulsar_status_codes(broker: ServeProcess) -> None:
    base = "/admin/v2/scalable/public/default/contract"
    assert call(broker, "PUT", f"{base}?numInitialSegments=2") == (204, None)
    assert call(broker, "PUT", f"{base}?numInitialSegments=2")[0] == 409
    status, listed = call(broker, "GET", "/admin/v2/scalable/public/default")
    assert status == 200 and "topic://public/default/contract" in listed
    status, layout = call(broker, "GET", base)
    assert status == 200 and layout["epoch"] == 0
    assert {s["state"] for s in layout["segments"].values()} == {"ACTIVE"} and len(layout["segments"]) == 2
    status, stats = call(broker, "GET", f"{base}/stats")
    assert status == 200
    assert sorted(s["topic"] for s in stats["segments"].values()) == [
        "segment://public/default/contract/0000-7fff-0", "segment://public/default/contract/8000-ffff-1"]
    assert call(broker, "PUT", f"{base}/subscriptions/sub") == (204, None)
    assert call(broker, "POST", f"{base}/split/0") == (204, None)
    status, layout = call(broker, "GET", base)
    assert layout["epoch"] == 1 and layout["segments"]["0"]["state"] == "SEALED"
    children = layout["segments"]["0"]["childIds"]
    assert len(children) == 2
    assert call(broker, "POST", f"{base}/merge/{children[0]}/{children[1]}") == (204, None)
    assert call(broker, "DELETE", f"{base}/subscriptions/sub") == (204, None)
    assert call(broker, "DELETE", base) == (204, None)
    assert call(broker, "GET", base)[0] == 404


def test_segment_topics_are_created_terminated_and_deleted_over_rest(broker: ServeProcess) -> None:
    base = "/admin/v2/segments/public/default/contract-seg/0000-ffff-0"
    assert call(broker, "PUT", base, ["pre-created"]) == (204, None)
    status, info = call(broker, "GET", base)
    assert status == 200 and "pre-created" in info["subscriptions"]
    assert call(broker, "POST", f"{base}/terminate") == (204, None)
    assert call(broker, "DELETE", base) == (204, None)
    status, error = call(broker, "PUT", "/admin/v2/segments/public/default/contract-seg/not-a-descriptor")
    assert 400 <= status < 500 and "reason" in error


@pytest.mark.parametrize("version", ["v2", "v3"])
def test_transaction_keys_are_listed_and_an_unknown_one_is_404_json(broker: ServeProcess, version: str) -> None:
    status, keys = call(broker, "GET", f"/admin/{version}/transactions/transaction-keys")
    assert status == 200 and isinstance(keys, list)
    for method in ("GET", "DELETE"):
        status, error = call(broker, method, f"/admin/{version}/transactions/transaction-keys/no-such-key")
        assert status == 404 and "reason" in error


def test_pulsar_v3_transactions_coordinator_stats(broker: ServeProcess) -> None:
    status, stats = call(broker, "GET", "/admin/v3/transactions/coordinatorStats")
    assert status == 200
    assert stats["0"]["state"] == "Ready"


def test_the_metric_names_the_specs_list_are_on_metrics(broker: ServeProcess) -> None:
    with urllib.request.urlopen(broker.http_url + "/metrics", timeout=10) as reply:
        text = reply.read().decode()
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    for name, kind in SPEC_METRICS:
        family = name.removesuffix("_total")
        assert types.get(name, types.get(family)) == kind, name


# -- in-process: layout, interfaces, client API, CLI, quickstart ---------------------------------

INTERFACES = {
    "pyengine.storage": ["ManagedLedger", "ManagedCursor"],
    "pyengine.metadata": ["MetadataStore", "LeaderElection", "open_metadata_store"],
    "pyengine.transaction.coordinator": ["TransactionMetadataStore"],
    "pyengine.transaction.buffer": ["TransactionBuffer"],
    "pyengine.transaction.pendingack": ["PendingAckHandle"],
    "pyengine.broker": ["Broker", "BrokerService"],
    "pyengine.scalable": ["SegmentLayout"],
    "pyengine.client": ["Client", "Producer", "Consumer", "Reader"],
    "pyengine.admin": ["AdminServer"],
}


@pytest.mark.parametrize("module", sorted(INTERFACES))
def test_each_concept_has_its_interface_at_its_package_root(module: str) -> None:
    package = __import__(module, fromlist=["_"])
    for name in INTERFACES[module]:
        assert hasattr(package, name), f"{module}.{name}"


def test_the_fixed_top_level_layout() -> None:
    for path in ("core_ext", "bindings/Cargo.toml", "bindings/pyproject.toml", "pyengine", "spark_udfs",
                 "benchmarks/__main__.py", "tests", "pyproject.toml", "setup.py"):
        assert (ROOT / path).exists(), path


def test_broker_embedded_is_the_embedding_entry_point() -> None:
    from pyengine.broker import Broker

    assert callable(Broker.embedded)
    assert "data_dir" in inspect.signature(Broker.embedded).parameters


def test_the_asyncio_client_api_of_the_design() -> None:
    from pyengine.client import Client, Consumer, Producer
    from pyengine.client.transaction import Transaction

    assert inspect.iscoroutinefunction(Client.__aenter__) and inspect.iscoroutinefunction(Client.__aexit__)
    expected = {
        Client.new_transaction: ["timeout_ms"], Client.create_producer: ["topic"],
        Client.subscribe: ["topic", "consumer_type", "initial_position"], Consumer.receive: [],
        Producer.send: ["data", "txn"], Consumer.acknowledge: ["txn"], Consumer.acknowledge_cumulative: ["txn"],
        Consumer.redeliver_unacknowledged_messages: [], Transaction.commit: [], Transaction.abort: [],
    }
    for method, names in expected.items():
        assert inspect.iscoroutinefunction(method), method.__qualname__
        parameters = inspect.signature(method).parameters
        for name in names:
            assert name in parameters, f"{method.__qualname__}({name}=)"


def test_the_cli_has_the_commands_of_the_design() -> None:
    from pyengine.cli import COMMANDS

    assert {"serve", "admin", "perf", "pipeline", "demo"} <= set(COMMANDS)


def test_the_readme_quickstart_is_make_run_and_make_test_and_ci_runs_the_second() -> None:
    readme = (ROOT / "README.md").read_text()
    quickstart = re.search(r"## Quickstart.*?```sh\n(.*?)```", readme, re.S)
    assert quickstart is not None
    commands = [line.split("#")[0].strip() for line in quickstart[1].splitlines() if line.strip()]
    assert commands == ["make run", "make test"]
    ci = ROOT / ".ci" / "run"
    assert os.access(ci, os.X_OK)
    assert re.search(r"^make test$", ci.read_text(), re.M)
    assert re.search(r"^test:.*\n\t(?:\w+=\S* )*\$\(PY\) -m pytest", (ROOT / "Makefile").read_text(), re.M)
