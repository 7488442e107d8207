"""A watch the backend fails (etcd reports the history it must resume from compacted) is
released by the store like a closed one. Found by an audit: failing a watch marked it closed
without its close hook, so the store kept it in its set of open watches for as long as the
store lived (and `close()` on it did nothing): one more for every watch etcd failed, on a
long-running broker whose DAG watches and elections re-open theirs each time."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.metadata import CompactedError
from pyengine.metadata.etcd_store import EtcdMetadataStore


class CompactedStream:
    """An etcd watch stream that reports its start revision compacted."""

    def __init__(self):
        self.cancelled = asyncio.Event()

    def __aiter__(self):
        return self

    async def __anext__(self):
        raise CompactedError("etcdserver: mvcc: required revision has been compacted")

    async def cancel(self):
        self.cancelled.set()


async def test_a_watch_failed_by_etcd_is_released(etcd_server):
    store = await EtcdMetadataStore(etcd_server.host, etcd_server.port, root="/failed-watch").start()
    try:
        stream = CompactedStream()

        async def compacted_watch(*args, **kwargs):
            return stream
        store.client.watch = compacted_watch
        watch = await store.watch("/a", prefix=True)
        with pytest.raises(CompactedError):
            await watch.next(2)
        await asyncio.wait_for(stream.cancelled.wait(), 2)     # the pump let go of its stream
        assert watch not in store._watches
        for _ in range(10):
            if not store._pumps:
                break
            await asyncio.sleep(0.01)
        assert not store._pumps
    finally:
        await store.close()
