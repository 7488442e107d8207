"""`pyengine admin topics compact` / `compaction-status` (pulsar-admin's names and -w flag) over
PUT / GET .../compaction."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.cli import admin as admin_cli

T = "persistent://public/default/cc"


async def test_compact_then_wait_for_its_status(admin, client, service):
    producer = await client.create_producer(T)
    for i in range(4):
        await producer.send(b"v%d" % i, key=f"k{i % 2}")
    assert await admin("topics", "compaction-status", T) == (0, {"status": "NOT_RUN", "lastError": ""}, "")
    status, out, err = await admin("topics", "compact", T)
    assert (status, out, err) == (0, None, "")
    status, out, _ = await admin("topics", "compaction-status", T, "--wait-complete")
    assert status == 0 and out["status"] == "SUCCESS"
    topic = await service.get_topic(T, create=False)
    assert topic.compaction.status == "SUCCESS"
    await producer.close()


async def test_compact_while_running_and_unknown_topics_fail(admin, client, service):
    await client.create_producer(T)
    topic = await service.get_topic(T, create=False)
    release = asyncio.Event()

    async def slow() -> None:
        await release.wait()

    topic.compaction.status = "RUNNING"
    task = asyncio.ensure_future(slow())
    topic.compaction._task = task            # what `running` looks at
    try:
        assert topic.compaction.running
        status, _, err = await admin("topics", "compact", T)
        assert status == 1 and "409" in err and "already in progress" in err
    finally:
        release.set()
        await task
        topic.compaction.status, topic.compaction._task = "NOT_RUN", None
    for command in ("compact", "compaction-status"):
        status, _, err = await admin("topics", command, "persistent://public/default/nothing-here")
        assert status == 1 and "404" in err


async def test_a_partitioned_topic_compacts_each_partition(admin, client, service):
    await service.policies.create_partitioned_topic(T, 2)
    partitions = [f"{T}-partition-{i}" for i in range(2)]
    for partition in partitions:
        producer = await client.create_producer(partition)
        for i in range(4):
            await producer.send(b"v%d" % i, key=f"k{i % 2}")
        await producer.close()
    assert (await admin("topics", "compact", T))[0] == 0
    for partition in partitions:
        status, out, err = await admin("topics", "compaction-status", partition, "-w")
        assert (status, out["status"] if out else None, err) == (0, "SUCCESS", "")
    status, _, err = await admin("topics", "compaction-status", T)        # as in Pulsar: 404
    assert status == 1 and "404" in err


def test_wait_complete_polls_while_running_and_an_error_exits_with_1(monkeypatch):
    monkeypatch.setattr(admin_cli, "COMPACTION_POLL_S", 0)
    replies = iter([{"status": "RUNNING", "lastError": ""}, {"status": "SUCCESS", "lastError": ""}])
    args = type("A", (), {"wait_complete": True})()
    assert admin_cli._compaction_status(args, {"status": "RUNNING"}, lambda: next(replies))["status"] == "SUCCESS"
    args.wait_complete = False
    assert admin_cli._compaction_status(args, {"status": "RUNNING"}, lambda: 1 / 0) == {"status": "RUNNING"}
    with pytest.raises(admin_cli.AdminCallError, match="Error in compaction: disk full"):
        admin_cli._compaction_status(args, {"status": "ERROR", "lastError": "disk full"}, lambda: None)


def test_the_commands_parse_as_pulsar_admin_s():
    import argparse

    parser = argparse.ArgumentParser()
    admin_cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["admin", "topics", "compaction-status", T, "-w"])
    assert args.wait_complete and args.admin_request(args) == (
        "GET", "/admin/v2/persistent/public/default/cc/compaction", None)
    args = parser.parse_args(["admin", "topics", "compact", T])
    assert args.admin_request(args) == ("PUT", "/admin/v2/persistent/public/default/cc/compaction", None)
