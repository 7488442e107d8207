"""`pyengine admin ...` against a live admin server: JSON on stdout, and for a failure the
server's reason on stderr with exit status 1."""

from __future__ import annotations

import asyncio
import json

import pytest

from pyengine.cli import main


async def test_tenants_and_namespaces(admin):
    assert await admin("tenants", "list") == (0, ["public", "pulsar"], "")
    assert (await admin("tenants", "create", "acme", "--admin-roles", "ops,dev"))[0] == 0
    assert (await admin("tenants", "get", "acme"))[1] == {"adminRoles": ["ops", "dev"],
                                                           "allowedClusters": ["standalone"]}
    assert await admin("namespaces", "create", "acme/x") == (0, None, "")
    assert (await admin("namespaces", "list", "acme"))[1] == ["acme/x"]
    assert (await admin("namespaces", "set-deduplication", "acme/x", "--enable"))[0] == 0
    assert (await admin("namespaces", "get-deduplication", "acme/x"))[1] is True
    assert (await admin("namespaces", "policies", "acme/x"))[1]["deduplicationEnabled"] is True
    assert (await admin("namespaces", "delete", "acme/x"))[0] == 0
    assert (await admin("tenants", "delete", "acme"))[0] == 0


async def test_topics(admin, client):
    topic = "persistent://public/default/t"
    assert (await admin("topics", "create-partitioned-topic", topic, "-p", "4"))[0] == 0
    assert (await admin("topics", "get-partitioned-topic-metadata", topic))[1] == {"partitions": 4}
    assert (await admin("topics", "update-partitioned-topic", topic, "-p", "5"))[0] == 0
    assert (await admin("topics", "list-partitioned-topics", "public/default"))[1] == [topic]
    producer = await client.create_producer(f"{topic}-partition-0")
    await producer.send(b"hello")
    stats = (await admin("topics", "stats", f"{topic}-partition-0"))[1]
    assert stats["msgInCounter"] == 1
    assert (await admin("topics", "partitioned-stats", topic))[1]["msgInCounter"] == 1
    assert (await admin("topics", "stats-internal", f"{topic}-partition-0"))[1]["numberOfEntries"] == 1
    internal = (await admin("topics", "partitioned-stats-internal", topic))[1]
    assert internal["partitions"][f"{topic}-partition-0"]["numberOfEntries"] == 1
    assert (await admin("topics", "last-message-id", f"{topic}-partition-0"))[1]["entryId"] == 0
    assert (await admin("topics", "create-subscription", topic, "-s", "s", "-m", "earliest"))[0] == 0
    assert (await admin("topics", "subscriptions", topic))[1] == ["s"]
    assert (await admin("topics", "reset-cursor", f"{topic}-partition-0", "-s", "s", "-m", "latest"))[0] == 0
    assert (await admin("topics", "reset-cursor", topic, "-s", "s", "-t", "1h"))[0] == 0
    assert (await admin("topics", "clear-backlog", topic, "-s", "s"))[0] == 0
    assert (await admin("topics", "unsubscribe", topic, "-s", "s"))[0] == 0
    await producer.close()
    assert (await admin("topics", "delete-partitioned-topic", topic))[0] == 0

    assert (await admin("topics", "create", "plain"))[0] == 0                 # short names work too
    assert (await admin("topics", "list", "public/default"))[1] == ["persistent://public/default/plain"]
    assert (await admin("topics", "set-deduplication", "plain", "--enable"))[0] == 0
    assert (await admin("topics", "get-deduplication", "plain", "--applied"))[1] is True
    assert (await admin("topics", "terminate", "plain"))[1]["partitionIndex"] == -1
    assert (await admin("topics", "delete", "plain", "--force"))[0] == 0


async def test_transactions(admin, client):
    producer = await client.create_producer("persistent://public/default/out")
    txn = await client.new_transaction()
    await producer.send(b"x", txn=txn)
    most, least = str(txn.txn_id.most_bits), str(txn.txn_id.least_bits)
    stats = (await admin("transactions", "coordinator-stats"))[1]
    assert sum(c["ongoingTxnSize"] for c in stats.values()) == 1
    assert (await admin("transactions", "coordinator-stats", "-c", most))[1]["ongoingTxnSize"] == 1
    assert (await admin("transactions", "get-metadata", most, least))[1]["status"] == "OPEN"
    assert str(txn.txn_id) in (await admin("transactions", "slow-transactions", "-t", "0s"))[1]
    assert (await admin("transactions", "buffer-stats", "out"))[1]["ongoingTxnSize"] == 1
    await client.subscribe("persistent://public/default/out", "sub")
    pending = (await admin("transactions", "pending-ack-stats", "out", "-s", "sub", "--low-water-marks"))[1]
    assert pending["ongoingTxnSize"] == 0 and "lowWaterMarks" in pending
    assert (await admin("transactions", "in-buffer-stats", "out", most, least))[1]["aborted"] is False
    assert await admin("transactions", "abort", most, least) == (0, None, "")
    assert (await admin("transactions", "transaction-metadata", most, least))[1]["status"] == "ABORTED"
    assert (await admin("transactions", "in-buffer-stats", "out", most, least))[1]["aborted"] is True


async def test_errors_exit_with_the_servers_reason(admin, server):
    assert await admin("tenants", "get", "nobody") == (1, None, "error: HTTP 404: tenant nobody does not exist\n")
    status, _, err = await admin("topics", "create-partitioned-topic", "t", "-p", "0")
    assert status == 1 and err.startswith("error: HTTP 406: ")
    status, _, err = await admin("transactions", "abort", "0", "77")
    assert (status, err) == (1, "error: HTTP 404: transaction (0,77) not found: coordinator 0 never handed it out\n")
    status, _, err = await admin("topics", "stats", "non-persistent://public/default/t")
    assert status == 1 and "only persistent://" in err
    status, _, err = await admin("namespaces", "create", "just-a-tenant")
    assert status == 1 and "tenant/namespace" in err


async def test_unreachable_server(capsys):
    status = await asyncio.to_thread(main, ["admin", "--url", "http://127.0.0.1:9", "tenants", "list"])
    assert status == 1 and capsys.readouterr().err.startswith("error: cannot reach the admin API at")


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["admin", "topics", "reset-cursor", "t", "-s", "s", "-t", "yesterday"])
    assert stopped.value.code == 2 and "expected a duration" in capsys.readouterr().err


async def test_schemas(admin, tmp_path):
    topic = "persistent://public/default/typed"
    definition = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]}
    payload = tmp_path / "schema.json"
    payload.write_text(json.dumps({"type": "AVRO", "schema": json.dumps(definition), "properties": {}}))
    assert await admin("schemas", "upload", topic, "-f", str(payload)) == (0, {"version": {"version": 0}}, "")
    assert json.loads((await admin("schemas", "get", topic))[1]["data"]) == definition
    assert (await admin("schemas", "get", topic, "--version", "0"))[1]["version"] == 0
    assert (await admin("schemas", "compatibility", topic, "-f", str(payload)))[1]["compatibility"] is True
    assert len((await admin("schemas", "get-all-versions", topic))[1]["getSchemaResponses"]) == 1
    assert (await admin("namespaces", "set-schema-compatibility-strategy", "public/default", "-c", "BACKWARD"))[0] == 0
    assert (await admin("namespaces", "get-schema-compatibility-strategy", "public/default"))[1] == "BACKWARD"
    assert (await admin("namespaces", "set-is-allow-auto-update-schema", "public/default"))[0] == 0
    assert (await admin("namespaces", "set-schema-validation-enforce", "public/default", "--enable"))[0] == 0
    assert (await admin("namespaces", "policies", "public/default"))[1]["is_allow_auto_update_schema"] is False
    assert (await admin("topics", "create", topic))[0] == 0
    assert (await admin("topics", "set-schema-compatibility-strategy", topic, "-c", "FORWARD"))[0] == 0
    assert (await admin("topics", "get-schema-compatibility-strategy", topic))[1] == "FORWARD"
    assert (await admin("topics", "remove-schema-compatibility-strategy", topic))[0] == 0
    assert (await admin("topics", "get-schema-compatibility-strategy", topic, "--applied"))[1] == "BACKWARD"
    assert await admin("schemas", "delete", topic) == (0, {"version": 1}, "")
    status, _, err = await admin("schemas", "get", topic)
    assert (status, err) == (1, "error: HTTP 404: Schema is deleted\n")
    status, _, err = await admin("schemas", "upload", topic, "-f", str(tmp_path / "missing.json"))
    assert status == 1 and "cannot read" in err and "missing.json" in err
    (tmp_path / "bad.json").write_text("{not json")
    status, _, err = await admin("schemas", "upload", topic, "-f", str(tmp_path / "bad.json"))
    assert status == 1 and "is not JSON" in err


async def test_skip(admin, client):
    topic = "persistent://public/default/sk"
    producer = await client.create_producer(topic)
    for i in range(3):
        await producer.send(b"m%d" % i)
    assert (await admin("topics", "create-subscription", topic, "-s", "s", "-m", "earliest"))[0] == 0
    assert await admin("topics", "skip", topic, "-s", "s", "-n", "2") == (0, None, "")
    assert (await admin("topics", "stats", topic))[1]["subscriptions"]["s"]["msgBacklog"] == 1
    status, _, err = await admin("topics", "skip", topic, "-s", "s", "-n", "0")
    assert status == 1 and err.startswith("error: HTTP 400: ") and "numMessages" in err
    status, _, err = await admin("topics", "skip", topic, "-s", "s", "-n", "-3")
    assert status == 1 and err.startswith("error: HTTP 400: ")
    status, _, err = await admin("topics", "skip", topic, "-s", "nope", "-n", "1")
    assert status == 1 and err.startswith("error: HTTP 404: ")
    assert (await admin("topics", "create-partitioned-topic", "pt", "-p", "2"))[0] == 0
    status, _, err = await admin("topics", "skip", "pt", "-s", "s", "-n", "1")
    assert (status, err) == (1, "error: HTTP 405: Skip messages on a partitioned topic is not allowed\n")
    await producer.close()


def test_skip_usage_errors_exit_2(capsys):
    for args in (["-n", "many"], [], ["-n", "1.5"]):
        with pytest.raises(SystemExit) as stopped:
            main(["admin", "topics", "skip", "t", "-s", "s", *args])
        assert stopped.value.code == 2
    capsys.readouterr()
