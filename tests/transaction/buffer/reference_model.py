"""A small pure-Python model of one topic's READ_COMMITTED view under transactions.

It knows nothing of snapshots, replay, markers or the kernels: only what each txn's
coordinator decided, what the topic was told, and where each entry landed. Visibility, spelled
out once: an entry is visible iff it is a plain entry or an entry of a txn that committed on
the topic, and it lies before the first entry of every txn still open on the topic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

Pos = tuple[int, int]
Txn = tuple[int, int]          # (coordinator id, sequence)


class Status(Enum):
    OPEN = "open"
    COMMITTED = "committed"
    ABORTED = "aborted"


@dataclass
class TopicModel:
    entries: dict[Pos, Txn | None] = field(default_factory=dict)       # position -> txn (None: plain)
    coordinator: dict[Txn, Status] = field(default_factory=dict)       # what each coordinator decided
    topic: dict[Txn, Status] = field(default_factory=dict)             # what the topic knows (OPEN: has entries)
    next_sequence: dict[int, int] = field(default_factory=dict)
    low_watermarks: dict[int, int] = field(default_factory=dict)       # what the topic was told

    def new_txn(self, coordinator_id: int) -> Txn:
        sequence = self.next_sequence.get(coordinator_id, 0)
        self.next_sequence[coordinator_id] = sequence + 1
        txn = (coordinator_id, sequence)
        self.coordinator[txn] = Status.OPEN
        return txn

    def coordinator_low_watermark(self, coordinator_id: int) -> int:
        """Highest sequence such that the coordinator decided every txn up to it."""
        sequence = -1
        while self.coordinator.get((coordinator_id, sequence + 1), Status.OPEN) is not Status.OPEN:
            sequence += 1
        return sequence

    def topic_low_watermark(self, coordinator_id: int) -> int:
        return self.low_watermarks.get(coordinator_id, -1)

    def append_refused(self, txn: Txn) -> bool:
        """The topic refuses a txn it saw end, and any txn at or below the watermark it knows."""
        status = self.topic.get(txn)
        return (status is not None and status is not Status.OPEN) or txn[1] <= self.topic_low_watermark(txn[0])

    def append(self, position: Pos, txn: Txn | None) -> None:
        assert position not in self.entries
        self.entries[position] = txn
        if txn is not None:
            self.topic.setdefault(txn, Status.OPEN)

    def end_on_topic(self, txn: Txn, outcome: Status, low_watermark: int) -> None:
        """The topic is told `txn` ended. A txn it never heard of that is at or below the
        watermark it already knows changes nothing (it ended long ago)."""
        known = self.topic.get(txn)
        if known is None and txn[1] <= self.topic_low_watermark(txn[0]):
            pass
        elif known is None or known is Status.OPEN:
            self.topic[txn] = outcome
        self.apply_low_watermark(txn[0], low_watermark)

    def apply_low_watermark(self, coordinator_id: int, low_watermark: int) -> None:
        """Every txn of that coordinator still open on the topic at or below the watermark
        ended without the topic hearing of it: the topic aborts it."""
        current = max(low_watermark, self.topic_low_watermark(coordinator_id))
        self.low_watermarks[coordinator_id] = current
        for txn, status in self.topic.items():
            if txn[0] == coordinator_id and txn[1] <= current and status is Status.OPEN:
                self.topic[txn] = Status.ABORTED

    def trim_before(self, first_position: Pos) -> None:
        for position in [p for p in self.entries if p < first_position]:
            del self.entries[position]

    def open_txns(self) -> dict[Txn, Pos]:
        """Txns open on the topic -> their first entry."""
        firsts: dict[Txn, Pos] = {}
        for position, txn in sorted(self.entries.items()):
            if txn is not None and self.topic[txn] is Status.OPEN and txn not in firsts:
                firsts[txn] = position
        return firsts

    def visible(self) -> set[Pos]:
        horizon = min(self.open_txns().values(), default=None)
        return {position for position, txn in self.entries.items()
                if (horizon is None or position < horizon)
                and (txn is None or self.topic[txn] is Status.COMMITTED)}
