"""The transactions a topic has seen end, as long as it needs to remember them.

A txn that ended on the topic must never get another entry there (a late or retried send would
otherwise start it again). Below its coordinator's low watermark every txn has ended, so the
watermark alone refuses them: only the txns above it are kept, per coordinator, and pruned as
the watermark moves (a heap makes each prune proportional to what it drops).

Except the commits applied on a terminated topic: they have entries but no marker, so a replay
of those entries has nothing else to tell that they ended (an abort has the aborted set). They
stay below the watermark too (few: only txns with entries when the topic was terminated).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from pyengine.transaction import TxnAction
from pyengine_kernels import TxnId


class EndedTxns:
    def __init__(self) -> None:
        self._outcomes: dict[int, dict[int, TxnAction]] = {}    # coordinator -> least bits -> outcome
        self._heaps: dict[int, list[int]] = {}
        self._low_watermarks: dict[int, int] = {}
        self._unmarked: dict[int, set[int]] = {}                 # coordinator -> committed without marker

    def add(self, txn: TxnId, outcome: TxnAction) -> None:
        """Remember that `txn` ended with `outcome` (the first outcome recorded wins)."""
        most, least = txn.most_bits, txn.least_bits
        if least <= self._low_watermarks.get(most, -1):
            return
        outcomes = self._outcomes.setdefault(most, {})
        if least not in outcomes:
            outcomes[least] = outcome
            heapq.heappush(self._heaps.setdefault(most, []), least)

    def add_unmarked_commits(self, coordinator_id: int, least_bits: list[int]) -> None:
        """Remember commits of `coordinator_id` that have no marker (a terminated topic's),
        whatever the watermark: see the module's docstring."""
        if least_bits:
            self._unmarked.setdefault(coordinator_id, set()).update(least_bits)

    def unmarked_commits(self, coordinator_id: int) -> list[int]:
        return sorted(self._unmarked.get(coordinator_id, ()))

    def add_many(self, coordinator_id: int, least_bits: list[int], outcome: TxnAction) -> None:
        """`add` for many txns of one coordinator at once (loading a snapshot)."""
        low_watermark = self._low_watermarks.get(coordinator_id, -1)
        outcomes = self._outcomes.setdefault(coordinator_id, {})
        fresh = [least for least in least_bits if least > low_watermark and least not in outcomes]
        outcomes.update(dict.fromkeys(fresh, outcome))
        heap = self._heaps.setdefault(coordinator_id, [])
        heap.extend(fresh)
        heapq.heapify(heap)

    def outcome(self, txn: TxnId) -> TxnAction | None:
        outcomes = self._outcomes.get(txn.most_bits)
        outcome = outcomes.get(txn.least_bits) if outcomes else None
        if outcome is None and self._unmarked and txn.least_bits in self._unmarked.get(txn.most_bits, ()):
            return TxnAction.COMMIT
        return outcome

    def low_watermark(self, coordinator_id: int) -> int:
        """The highest sequence of `coordinator_id` known to have ended with all below it (-1: none)."""
        return self._low_watermarks.get(coordinator_id, -1)

    def low_watermarks(self) -> dict[int, int]:
        return dict(self._low_watermarks)

    def is_below_low_watermark(self, txn: TxnId) -> bool:
        return txn.least_bits <= self._low_watermarks.get(txn.most_bits, -1)

    def advance_low_watermark(self, coordinator_id: int, low_watermark: int) -> bool:
        """Raise the watermark (never lower it) and forget the txns it now covers; whether it moved."""
        if low_watermark <= self._low_watermarks.get(coordinator_id, -1):
            return False
        self._low_watermarks[coordinator_id] = low_watermark
        heap = self._heaps.get(coordinator_id)
        if heap:
            outcomes = self._outcomes[coordinator_id]
            while heap and heap[0] <= low_watermark:
                outcomes.pop(heapq.heappop(heap), None)
        return True

    def items(self) -> Iterator[tuple[int, int, dict[int, TxnAction]]]:
        """(coordinator id, low watermark, {least bits: outcome}) for every coordinator known."""
        for coordinator_id in sorted(self._low_watermarks.keys() | self._outcomes.keys() | self._unmarked.keys()):
            yield (coordinator_id, self._low_watermarks.get(coordinator_id, -1),
                   dict(self._outcomes.get(coordinator_id, {})))

    def __len__(self) -> int:
        return sum(len(outcomes) for outcomes in self._outcomes.values())
