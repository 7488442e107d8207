"""until_confirmed: retries, time-outs of hung calls, participants that are gone, bad backoffs."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.errors import PersistenceError, TopicNotFoundError
from pyengine.transaction.coordinator.retry import GONE_ERRORS, Backoff, until_confirmed

QUICK = Backoff(initial_ms=1, max_ms=2, call_timeout_ms=20)


class Calls:
    """A call that fails with `failures` in turn, then answers `result` after `delay` s."""

    def __init__(self, *failures: BaseException, delay: float = 0.0, result: str = "ok") -> None:
        self.failures = list(failures)
        self.delay = delay
        self.result = result
        self.attempts = 0

    async def __call__(self) -> str:
        self.attempts += 1
        if self.failures:
            raise self.failures.pop(0)
        await asyncio.sleep(self.delay)
        return self.result


async def test_retried_until_it_answers():
    call = Calls(PersistenceError("disk"), PersistenceError("disk"))
    assert await until_confirmed(call, "a write", QUICK) == "ok"
    assert call.attempts == 3


async def test_a_hung_call_is_abandoned_and_repeated():
    call = Calls(delay=0.2)
    task = asyncio.ensure_future(until_confirmed(call, "a participant", QUICK))
    await asyncio.sleep(0.1)
    assert call.attempts >= 2 and not task.done()      # each attempt timed out after 20 ms
    call.delay = 0
    assert await task == "ok"


async def test_a_local_write_is_not_timed_out():
    call = Calls(delay=0.06)                            # 3x the call timeout
    assert await asyncio.wait_for(until_confirmed(call, "a local write", QUICK, local=True), 2) == "ok"
    assert call.attempts == 1


async def test_a_participant_that_is_gone_ends_it_and_other_errors_propagate():
    assert await until_confirmed(Calls(TopicNotFoundError("t")), "x", QUICK, gone=GONE_ERRORS) is None
    with pytest.raises(ValueError):
        await until_confirmed(Calls(ValueError("bug")), "x", QUICK, retry_on=(PersistenceError,))


async def test_a_cancelled_caller_stops_retrying():
    call = Calls(*[PersistenceError("disk")] * 1000)
    task = asyncio.ensure_future(until_confirmed(call, "a write", QUICK))
    await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    attempts = call.attempts
    await asyncio.sleep(0.02)
    assert call.attempts == attempts


@pytest.mark.parametrize("kwargs", [dict(initial_ms=0), dict(max_ms=-1), dict(call_timeout_ms=1.5),
                                    dict(initial_ms=True), dict(initial_ms=10, max_ms=5)])
def test_malformed_backoffs_are_refused(kwargs):
    with pytest.raises(ValueError):
        Backoff(**kwargs)
