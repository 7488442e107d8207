"""An outcome that many callers await and none of them may cancel.

A cancelled request (a client gone, a timeout) must not make an ending, a marker or a log
write (coordinator log, pending-ack log) that may still succeed look failed to the others
waiting on it. Over a shared future, `asyncio.shield` does that at three event-loop hops per
caller (the future's done callback, the shield's own, the caller's wake-up); a transaction's
path awaits several such outcomes, and those hops were a tenth of its CPU. Here each caller
waits on a future of its own, which setting the outcome completes directly: one hop, the
caller's wake-up.
"""

from __future__ import annotations

import asyncio
from typing import Generic, TypeVar

T = TypeVar("T")
_PRUNE_AT = 64


class Outcome(Generic[T]):
    __slots__ = ("_waiters", "_prune_at", "_done", "_result", "_exception", "_cancelled")

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future[T]] = []
        self._prune_at = _PRUNE_AT
        self._done = False
        self._cancelled = False
        self._result: T | None = None
        self._exception: BaseException | None = None

    def done(self) -> bool:
        return self._done

    def set_result(self, result: T) -> None:
        self._settle(result, None, cancelled=False)

    def set_exception(self, exception: BaseException) -> None:
        self._settle(None, exception, cancelled=False)

    def cancel(self) -> None:
        """Cancelled by its owner (every waiter gets CancelledError)."""
        self._settle(None, None, cancelled=True)

    def waiter(self) -> asyncio.Future[T]:
        """A future of the caller's own, resolved with the outcome; cancelling it cancels
        nothing else."""
        waiter: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        if self._done:
            self._complete(waiter)
            return waiter
        if len(self._waiters) >= self._prune_at:
            # Callers that gave up (a client repeating a request that times out, against an
            # outcome that takes long) leave their cancelled waiters here: dropped now and then,
            # at a cost shared by the appends, rather than by a done callback per waiter.
            self._waiters = [w for w in self._waiters if not w.done()]
            self._prune_at = max(_PRUNE_AT, 2 * len(self._waiters))
        self._waiters.append(waiter)
        return waiter

    def _settle(self, result: T | None, exception: BaseException | None, *, cancelled: bool) -> None:
        if self._done:
            raise asyncio.InvalidStateError("the outcome is already set")
        self._done, self._result, self._exception, self._cancelled = True, result, exception, cancelled
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():                   # done: its caller was cancelled
                self._complete(waiter)

    def _complete(self, waiter: asyncio.Future[T]) -> None:
        if self._cancelled:
            waiter.cancel()
        elif self._exception is not None:
            waiter.set_exception(self._exception)
        else:
            waiter.set_result(self._result)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        if not self._done:
            return f"<Outcome pending, {len(self._waiters)} waiting>"
        if self._cancelled:
            return "<Outcome cancelled>"
        if self._exception is not None:
            return f"<Outcome exception={self._exception!r}>"
        return f"<Outcome result={self._result!r}>"


def mark_retrieved(future: asyncio.Future) -> None:
    """Done callback of a future that may have no awaiter: its failure counts as seen (no
    "exception was never retrieved" report); whoever needs the failure awaits the future."""
    if not future.cancelled():
        future.exception()
