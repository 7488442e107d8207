"""`pyengine perf`'s pacer: `take` (is the next send due now?) and `wait` (sleep until it is)
agree about every send, also where rate * time rounds across a whole number."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.cli.perf import Pacer


# 1000 / 999999.9999999999 == 0.001 (send 1000 is due at 0 within the 1 ms), yet
# 0.001 * 999999.9999999999 == 999.9999999999999 (floor: 999, so only sends 0..999).
@pytest.mark.parametrize(("rate", "now"), [(999999.9999999999, 0.0)])
async def test_take_lets_go_every_send_wait_would_not_sleep_for(rate, now, monkeypatch):
    pacer = Pacer(rate)
    pacer.start = 0.0
    pacer._time = lambda: now
    while pacer.take():
        pass
    slept = []

    async def fake_sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(asyncio, "sleep", fake_sleep)
    await pacer.wait()
    assert slept, f"send {pacer.sent - 1} was due for wait() but take() held it back"
