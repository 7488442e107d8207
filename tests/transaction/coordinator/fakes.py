"""Test doubles for the coordinator: a clock tests move by hand, and participants that record
every call and fail or hang on demand."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from pyengine.transaction import TxnAction
from pyengine_kernels import TxnId

START_MS = 1_700_000_000_000


class FakeClock:
    def __init__(self, now_ms: int = START_MS) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> None:
        self.now_ms += ms


@dataclass(frozen=True)
class Call:
    """One participant call. `target` is the topic, or (topic, subscription)."""

    target: str | tuple[str, str]
    txn: TxnId
    action: TxnAction
    low_watermark: int
    confirmed: bool          # False: the call raised


class RecordingParticipants:
    def __init__(self) -> None:
        self.calls: list[Call] = []
        self._failures: dict[object, list[BaseException]] = {}
        self._blocked: dict[object, asyncio.Event] = {}
        self._arrived: dict[object, asyncio.Event] = {}

    def fail(self, target: str | tuple[str, str], *errors: BaseException) -> None:
        """The next calls to `target` raise `errors`, one each, in order."""
        self._failures.setdefault(target, []).extend(errors)

    def block(self, target: str | tuple[str, str]) -> asyncio.Event:
        """Calls to `target` hang until the returned event is set."""
        event = asyncio.Event()
        self._blocked[target] = event
        self._arrived[target] = asyncio.Event()
        return event

    async def reached(self, target: str | tuple[str, str]) -> None:
        """Wait until a call reaches the blocked `target` (so its txn's decision is durable)."""
        await asyncio.wait_for(self._arrived[target].wait(), 10)

    def told(self, txn: TxnId) -> dict[object, set[TxnAction]]:
        """Confirmed calls for `txn`: target -> actions."""
        result: dict[object, set[TxnAction]] = {}
        for call in self.calls:
            if call.txn == txn and call.confirmed:
                result.setdefault(call.target, set()).add(call.action)
        return result

    def calls_for(self, txn: TxnId) -> list[Call]:
        return [call for call in self.calls if call.txn == txn]

    async def end_txn_on_partition(self, topic: str, txn: TxnId, action: TxnAction, low_watermark: int, *,
                                   after: asyncio.Future | None = None) -> None:
        if after is not None:           # not in the coordinator's storage: wait for the decision
            await asyncio.shield(after)
        await self._handle(topic, txn, action, low_watermark)

    async def end_txn_on_subscription(self, topic: str, subscription: str, txn: TxnId, action: TxnAction,
                                      low_watermark: int) -> None:
        await self._handle((topic, subscription), txn, action, low_watermark)

    async def _handle(self, target: str | tuple[str, str], txn: TxnId, action: TxnAction, low_watermark: int) -> None:
        assert isinstance(action, TxnAction)
        blocked = self._blocked.get(target)
        if blocked is not None:
            self._arrived[target].set()
            await blocked.wait()
        failures = self._failures.get(target)
        if failures:
            self.calls.append(Call(target, txn, action, low_watermark, confirmed=False))
            raise failures.pop(0)
        self.calls.append(Call(target, txn, action, low_watermark, confirmed=True))


class StartingParticipants(RecordingParticipants):
    """Also offers `end_txn_on_partition_now`, for the partitions in `at_once`: the call is
    started before it returns (the others get None, so the coordinator awaits the coroutine)."""

    def __init__(self, at_once: set[str]) -> None:
        super().__init__()
        self.at_once = at_once
        self.started: list[tuple[str, bool]] = []     # (partition, was the decision still being written)

    def end_txn_on_partition_now(self, topic: str, txn: TxnId, action: TxnAction, low_watermark: int, *,
                                 after: asyncio.Future | None = None) -> asyncio.Future | None:
        if topic not in self.at_once:
            return None
        self.started.append((topic, after is not None and not after.done()))
        return asyncio.ensure_future(self.end_txn_on_partition(topic, txn, action, low_watermark, after=after))
