"""Findings of the second metadata-store review (watches, sessions, backends alike)."""

from __future__ import annotations

import pytest

from pyengine.metadata import MetadataStoreError, NotificationType

BIG = 1_100_000          # per record: under etcd's request limit; four exceed a 4 MiB gRPC message


async def test_a_watch_catches_up_on_more_than_a_grpc_message_of_changes(store):
    """A watch opened from an earlier revision (or resumed after a disconnection) gets the
    changes it missed from etcd in one reply of up to 1000 revisions. Once they exceeded
    gRPC's default 4 MiB receive limit, the client dropped the watch stream: the watch
    reconnected from the same revision, failed again, and never delivered anything (every
    other watch of the store lost its stream each time too). The local stores delivered."""
    page = await store.list_prefix("/w/")
    written = [await store.put(f"/w/{i}", bytes([i]) * BIG) for i in range(4)]
    watch = await store.watch("/w/", prefix=True, since=page.revision)
    try:
        got = [await watch.next(10) for _ in written]
    except TimeoutError:
        pytest.fail("the watch delivered nothing of the changes it had to catch up on")
    finally:
        watch.close()
    assert [(n.type, n.path, n.revision, n.value) for n in got] == [
        (NotificationType.CREATED, r.path, r.mod_revision, r.value) for r in written]
