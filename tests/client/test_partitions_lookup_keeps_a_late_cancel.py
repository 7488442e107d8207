"""A lookup of a topic's partition count that is cancelled as its answer comes ends
cancelled. Found by an audit: it waited with asyncio.wait_for, which on Python 3.11 returns an
answer that came as the caller was cancelled, so the cancel was lost and the caller (a
create_producer or subscribe under a timeout or a TaskGroup) went on as if nobody had
cancelled it; the client's other waits use asyncio.timeout for that reason."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.client.config import ClientConfig
from pyengine.client.lookup import LookupService
from pyengine.client.url import parse_service_url


async def test_a_cancel_accepted_by_the_lookup_is_never_lost():
    for turns in range(6):               # the cancel lands at each step of the lookup in turn
        lookup = LookupService(None, parse_service_url("pulsar://127.0.0.1:1"), ClientConfig())  # type: ignore[arg-type]

        async def answered(topic: str) -> int:
            return 3
        lookup._partitions_once = answered  # type: ignore[method-assign]
        task = asyncio.ensure_future(lookup.partitions("persistent://public/default/t"))
        for _ in range(turns):
            await asyncio.sleep(0)
        if task.cancel():
            with pytest.raises(asyncio.CancelledError):
                await task
        else:                            # done before the cancel: its answer stands
            assert await task == 3
