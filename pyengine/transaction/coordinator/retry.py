"""Repeat a call until it succeeds, with exponential back-off: how a coordinator completes a
decision that is already durable (participant calls, the final status write)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from pyengine.errors import SubscriptionNotFoundError, TopicNotFoundError

log = logging.getLogger(__name__)

T = TypeVar("T")

# A participant that no longer exists has nothing left to end (Pulsar answers END_TXN_ON_*
# for a missing topic or subscription with success, too).
GONE_ERRORS: tuple[type[Exception], ...] = (TopicNotFoundError, SubscriptionNotFoundError)


@dataclass(frozen=True)
class Backoff:
    initial_ms: int = 100
    max_ms: int = 10_000
    call_timeout_ms: int = 30_000     # a call not answered by then is abandoned and repeated

    def __post_init__(self) -> None:
        for name in ("initial_ms", "max_ms", "call_timeout_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"Backoff.{name} must be a positive int (ms), not {value!r}")
        if self.max_ms < self.initial_ms:
            raise ValueError("Backoff.max_ms must be >= Backoff.initial_ms")


async def until_confirmed(call: Callable[[], Awaitable[T]], what: str, backoff: Backoff, *,
                          gone: tuple[type[Exception], ...] = (),
                          retry_on: tuple[type[Exception], ...] = (Exception,),
                          local: bool = False) -> T | None:
    """Await `call()` until it returns (its result) or raises one of `gone` (None). Exceptions
    in `retry_on`, and a call that takes longer than `backoff.call_timeout_ms`, are retried
    after a growing pause; any other exception propagates. `local`: a write to this broker's
    own storage, which completes or fails but cannot hang: no timeout (it costs a timer)."""
    delay_ms = backoff.initial_ms
    attempt = 1
    while True:
        try:
            if local:
                return await call()
            async with asyncio.timeout(backoff.call_timeout_ms / 1000):
                return await call()
        except gone:
            return None
        except (*retry_on, TimeoutError) as exc:
            log.log(logging.WARNING if attempt == 1 else logging.DEBUG,
                    "%s failed (attempt %d), retrying in %d ms: %r", what, attempt, delay_ms, exc)
        await asyncio.sleep(delay_ms / 1000)
        delay_ms = min(delay_ms * 2, backoff.max_ms)
        attempt += 1
