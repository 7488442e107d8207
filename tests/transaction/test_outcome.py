"""Outcome: what asyncio.shield over a shared future gives, without its loop hops."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyengine.transaction.outcome import Outcome


async def test_every_waiter_gets_the_result_and_a_late_one_too():
    outcome: Outcome[int] = Outcome()
    waiters = [outcome.waiter() for _ in range(3)]
    assert not outcome.done() and not any(w.done() for w in waiters)
    outcome.set_result(7)
    assert outcome.done()
    assert await asyncio.gather(*waiters, outcome.waiter()) == [7, 7, 7, 7]


async def test_a_cancelled_caller_cancels_nothing_else():
    outcome: Outcome[str] = Outcome()
    gone = asyncio.ensure_future(outcome.waiter())
    kept = asyncio.ensure_future(outcome.waiter())
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.sleep(0)
    assert gone.cancelled() and not outcome.done()
    outcome.set_result("landed")
    assert await kept == "landed"


async def test_an_exception_reaches_every_waiter():
    outcome: Outcome[None] = Outcome()
    waiters = [outcome.waiter() for _ in range(2)]
    outcome.set_exception(RuntimeError("write failed"))
    for waiter in [*waiters, outcome.waiter()]:
        with pytest.raises(RuntimeError, match="write failed"):
            await waiter


async def test_cancelled_by_its_owner_cancels_the_waiters():
    outcome: Outcome[None] = Outcome()
    waiter = outcome.waiter()
    outcome.cancel()
    assert waiter.cancelled() and outcome.waiter().cancelled()


async def test_set_twice_is_an_error():
    outcome: Outcome[int] = Outcome()
    outcome.set_result(1)
    for settle in (lambda: outcome.set_result(2), lambda: outcome.set_exception(ValueError()), outcome.cancel):
        with pytest.raises(asyncio.InvalidStateError):
            settle()
    assert await outcome.waiter() == 1
    assert "result=1" in repr(outcome)


@given(st.lists(st.booleans(), max_size=300), st.sampled_from(["result", "exception", "cancel"]))
def test_waiters_cancelled_or_not_against_a_model(cancelled, how):
    """Any mix of callers, some cancelled before the outcome: the others all see it, the
    cancelled ones stay cancelled (the model: shield over one shared future)."""
    async def run():
        outcome: Outcome[int] = Outcome()
        waiters = [outcome.waiter() for _ in cancelled]
        for waiter, cancel in zip(waiters, cancelled):
            if cancel:
                waiter.cancel()
        {"result": lambda: outcome.set_result(5), "exception": lambda: outcome.set_exception(KeyError("k")),
         "cancel": outcome.cancel}[how]()
        for waiter, cancel in zip(waiters, cancelled):
            if cancel or how == "cancel":
                assert waiter.cancelled()
            elif how == "exception":
                assert isinstance(waiter.exception(), KeyError)
            else:
                assert waiter.result() == 5
    asyncio.run(run())


async def test_callers_that_gave_up_do_not_pile_up_on_a_long_outcome():
    """A client repeating a request that times out against an ending stuck on an unreachable
    participant: its cancelled waiters are dropped as new ones come, the live ones kept."""
    outcome: Outcome[int] = Outcome()
    live = outcome.waiter()
    for _ in range(10_000):
        outcome.waiter().cancel()
    assert len(outcome._waiters) < 200
    outcome.set_result(7)
    assert await live == 7
