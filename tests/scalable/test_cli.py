"""`pyengine admin scalable ...` and `pyengine admin segments ...` against a live admin server."""

from __future__ import annotations


import pytest

from pyengine.cli import main
from tests.admin.conftest import admin, api, client, server, service  # noqa: F401  (fixtures)


async def test_scalable_commands(admin, service):
    assert await admin("scalable", "create", "topic://public/default/t", "-n", "2", "-p", "team=a") == (0, None, "")
    assert (await admin("scalable", "list", "public/default"))[1] == ["topic://public/default/t"]
    metadata = (await admin("scalable", "get-metadata", "public/default/t"))[1]     # short form
    assert metadata["properties"] == {"team": "a"} and len(metadata["segments"]) == 2
    assert (await admin("scalable", "create-subscription", "topic://public/default/t", "-s", "sub"))[0] == 0
    assert (await admin("scalable", "split-segment", "topic://public/default/t", "1"))[0] == 0
    assert (await admin("scalable", "merge", "topic://public/default/t", "0", "2"))[0] == 0
    stats = (await admin("scalable", "stats", "topic://public/default/t"))[1]
    assert stats["epoch"] == 2 and stats["activeSegmentCount"] == 2
    assert (await admin("scalable", "delete-subscription", "topic://public/default/t", "-s", "sub"))[0] == 0
    assert (await admin("scalable", "delete", "topic://public/default/t"))[0] == 0
    assert (await admin("scalable", "list", "public/default"))[1] == []


async def test_segment_commands(admin, service):
    segment = "segment://public/default/raw/0000-ffff-0"
    assert (await admin("segments", "create", segment, "-s", "a", "-s", "b"))[0] == 0
    assert sorted((await service.get_topic(segment, create=False)).subscriptions) == ["a", "b"]
    assert (await admin("segments", "terminate", segment))[0] == 0
    assert (await service.get_topic(segment, create=False)).ledger.terminated_at is not None
    assert (await admin("segments", "delete", segment))[0] == 0
    assert not service.topic_exists(segment)


async def test_errors(admin):
    status, _, err = await admin("scalable", "split-segment", "topic://public/default/none", "0")
    assert status == 1 and err.startswith("error: HTTP 404: ")
    await admin("scalable", "create", "topic://public/default/t")
    status, _, err = await admin("scalable", "create", "topic://public/default/t")
    assert status == 1 and err.startswith("error: HTTP 409: ")
    status, _, err = await admin("scalable", "create", "topic://public/default/u", "-n", "0")
    assert (status, err) == (1, "error: HTTP 412: numInitialSegments must be >= 1\n")
    status, _, err = await admin("scalable", "split-segment", "persistent://public/default/t", "0")
    assert status == 1 and "topic://tenant/namespace/topic" in err
    status, _, err = await admin("segments", "terminate", "segment://public/default/t/0000-ffff")
    assert status == 1 and "invalid segment descriptor" in err
    status, _, err = await admin("segments", "delete", "topic://public/default/t")
    assert status == 1 and "segment://" in err


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["admin", "scalable", "split-segment", "topic://public/default/t", "first"])
    assert stopped.value.code == 2
    with pytest.raises(SystemExit) as stopped:
        main(["admin", "scalable", "create", "topic://public/default/t", "-p", "novalue"])
    assert stopped.value.code == 2 and "key=value" in capsys.readouterr().err
