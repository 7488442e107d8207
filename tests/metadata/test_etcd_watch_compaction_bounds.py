"""Opening an etcd watch from a revision (`since`) must judge the compacted history as the local
backends do: `watch` raises `CompactedError` at once when a change after `since` is gone (also
for `since=0`, "from the beginning"), and accepts every `since` whose next revision is kept
(etcd keeps the compaction revision itself). Runs its own etcd, as compaction is server-wide."""

from __future__ import annotations

import pytest

from pyengine.metadata import CompactedError, NotificationType
from pyengine.metadata.etcd_store import EtcdMetadataStore




async def test_watch_from_compacted_history_fails_at_once_and_the_compaction_revision_is_kept(own_etcd):
    store = await EtcdMetadataStore(own_etcd.host, own_etcd.port, root="/compaction").start()
    try:
        revisions = [(await store.put("/c/a", str(i).encode())).mod_revision for i in range(4)]
        compacted = revisions[2]
        await store.client.compact(compacted, physical=True)

        for since in (0, 1, revisions[0], compacted - 2):
            with pytest.raises(CompactedError):
                await store.watch("/c/a", since=since)

        # since = compacted - 1: the first change delivered is the compaction revision's, kept
        async with await store.watch("/c/a", since=compacted - 1) as watch:
            first = await watch.next(5)
            assert (first.type, first.revision, first.value) == (NotificationType.MODIFIED, compacted, b"2")
            assert (await watch.next(5)).revision == revisions[3]
    finally:
        await store.close()
