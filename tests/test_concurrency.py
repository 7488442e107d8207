"""`single_flight`: one run per key at a time, its outcome shared, a failed run not kept."""

import asyncio

import pytest

from pyengine.concurrency import single_flight


async def test_callers_share_one_run_and_a_failure_is_not_kept():
    running: dict = {}
    runs = []

    async def start(fail: bool):
        runs.append(fail)
        await asyncio.sleep(0.01)
        if fail:
            raise OSError("no")
        return len(runs)

    results = await asyncio.gather(*(single_flight(running, "k", lambda: start(True)) for _ in range(3)),
                                   return_exceptions=True)
    assert len(runs) == 1 and all(isinstance(r, OSError) for r in results)
    await asyncio.sleep(0)
    assert running == {}
    assert await asyncio.gather(single_flight(running, "k", lambda: start(False)),
                                single_flight(running, "other", lambda: start(False))) == [3, 3]
    assert len(runs) == 3


async def test_a_cancelled_caller_leaves_the_run_to_the_others():
    running: dict = {}
    release = asyncio.Event()

    async def start():
        await release.wait()
        return "opened"

    first = asyncio.ensure_future(single_flight(running, "k", start))
    second = asyncio.ensure_future(single_flight(running, "k", start))
    await asyncio.sleep(0)
    first.cancel()
    release.set()
    assert await second == "opened"
    with pytest.raises(asyncio.CancelledError):
        await first
