"""The in-memory pending acks of one subscription, with Pulsar's structures and conflict rules.

`individual_ack_of_txn` maps each transaction to the entries it acknowledged individually,
`individual_ack_positions` maps each entry to what all open transactions hold of it together,
and one transaction at a time may hold a cumulative ack. A `Reservation` holds either a whole
entry (`ack_set` None) or the batch indexes whose bit is CLEAR in `ack_set` (Pulsar's ack-set
convention: a set bit is an index left free). Reservations are immutable values: merging makes
new ones, so nothing is shared between a request, a transaction and the merged view (the
mutation through a shared position object was Pulsar #16032).

Nothing here does I/O; the handle checks a request against this state, then reserves.
"""

from __future__ import annotations

from bisect import insort
from dataclasses import dataclass
from typing import Protocol

from pyengine_kernels import (
    Position,
    TxnId,
    ackset_and,
    ackset_andnot,
    ackset_conflicts,
    ackset_new,
    ackset_or,
    ackset_unacked_count,
)


class AckedView(Protocol):
    """What the state reads of the subscription's cursor."""

    def is_acked(self, position: Position) -> bool: ...

    def batch_ack_set(self, position: Position) -> list[int] | None: ...


@dataclass(frozen=True, slots=True)
class Reservation:
    ack_set: tuple[int, ...] | None
    batch_size: int

    @property
    def whole(self) -> bool:
        return self.ack_set is None

    def requested(self) -> tuple[int, ...]:
        """The ack set for conflict tests: a whole entry acknowledges every index ([])."""
        return () if self.ack_set is None else self.ack_set


def _merge(a: Reservation, b: Reservation) -> Reservation:
    """What two disjoint reservations of one entry hold together."""
    if a.ack_set is None or b.ack_set is None:
        return Reservation(None, a.batch_size)
    return Reservation(tuple(ackset_and(a.ack_set, b.ack_set)), a.batch_size)


def _without(held: Reservation, removed: Reservation) -> Reservation | None:
    """`held` minus the indexes of `removed` (held |= ~removed within the batch); None when
    nothing is left."""
    if held.ack_set is None or removed.ack_set is None:
        return None
    size = held.batch_size
    freed = ackset_andnot(ackset_new(size), removed.ack_set)
    rest = ackset_or(held.ack_set, freed)
    if ackset_unacked_count(rest, size) == size:
        return None
    return Reservation(tuple(rest), size)


class PendingAckState:
    def __init__(self) -> None:
        self.individual_ack_of_txn: dict[TxnId, dict[Position, Reservation]] = {}
        self.individual_ack_positions: dict[Position, Reservation] = {}
        # The holder of the cumulative ack and the positions of its accepted requests (each
        # above the previous one); the last is its position. Keeping every request lets a
        # request whose write failed be undone exactly.
        self._cumulative_txn: TxnId | None = None
        self._cumulative_positions: list[Position] = []

    @property
    def cumulative_ack_of_txn(self) -> tuple[TxnId, Position] | None:
        if self._cumulative_txn is None:
            return None
        return self._cumulative_txn, self._cumulative_positions[-1]

    def holds(self, txn: TxnId) -> bool:
        """Whether `txn` holds anything."""
        return txn in self.individual_ack_of_txn or txn == self._cumulative_txn

    def txns(self) -> set[TxnId]:
        """Every transaction holding something."""
        held = set(self.individual_ack_of_txn)
        if self._cumulative_txn is not None:
            held.add(self._cumulative_txn)
        return held

    # --- conflicts ------------------------------------------------------------------------

    def individual_conflict(self, txn: TxnId, position: Position, wanted: Reservation,
                            cursor: AckedView) -> str | None:
        """Why `txn` may not reserve `wanted` of `position`, or None. A batch size different
        from the one an earlier reservation recorded is malformed input (ValueError)."""
        if cursor.is_acked(position):
            return f"message:{position} already acked before"
        size = wanted.batch_size
        acked = cursor.batch_ack_set(position)
        if acked is not None and ackset_conflicts(wanted.requested(), acked, size):
            return f"batch message:{position} already acked before"
        held = self.individual_ack_positions.get(position)
        if held is not None:
            if held.whole or wanted.whole:
                return f"message:{position} in pending ack status"
            if held.batch_size != size:
                raise ValueError(f"batch size {size} of {position} differs from the batch size "
                                 f"{held.batch_size} of an earlier acknowledgement")
            if ackset_conflicts(wanted.requested(), held.requested(), size):
                return f"batch message:{position} in pending ack status"
        holder = self.cumulative_ack_of_txn
        if holder is not None and holder[0] != txn and position <= holder[1]:
            return (f"message:{position} in pending ack status (cumulative ack of "
                    f"Transaction:{holder[0]} up to {holder[1]})")
        return None

    def cumulative_conflict(self, txn: TxnId, position: Position, mark_delete: Position) -> str | None:
        """Why `txn` may not acknowledge everything up to `position`, or None: Apache's rules
        (not at or below the mark-delete position, one transaction at a time, only forward)
        plus one Pulsar lacks: not over an entry another transaction holds individually."""
        if position <= mark_delete:
            return f"cumulative ack position:{position} within range of cursor's markDeletePosition:{mark_delete}"
        holder = self.cumulative_ack_of_txn
        if holder is not None:
            if holder[0] != txn:
                return (f"cumulative ack position:{position} while Transaction:{holder[0]} holds a "
                        f"pending cumulative ack up to {holder[1]}")
            if position <= holder[1]:
                return f"cumulative ack position:{position} within range of its current position:{holder[1]}"
        for other, positions in self.individual_ack_of_txn.items():
            if other == txn:
                continue
            for held in positions:
                if mark_delete < held <= position:
                    return (f"cumulative ack position:{position} covering message:{held} in pending "
                            f"ack status of Transaction:{other}")
        return None

    # --- changes --------------------------------------------------------------------------

    def reserve(self, txn: TxnId, position: Position, reservation: Reservation) -> None:
        """Record what `txn` holds of `position` (after `individual_conflict` said None)."""
        mine = self.individual_ack_of_txn.setdefault(txn, {})
        own = mine.get(position)
        mine[position] = reservation if own is None else _merge(own, reservation)
        held = self.individual_ack_positions.get(position)
        self.individual_ack_positions[position] = reservation if held is None else _merge(held, reservation)

    def release(self, txn: TxnId, position: Position, reservation: Reservation) -> None:
        """Give back exactly `reservation` of `position` that `txn` holds."""
        mine = self.individual_ack_of_txn.get(txn)
        if mine is None or position not in mine:
            return
        _shrink(mine, position, reservation)
        if not mine:
            del self.individual_ack_of_txn[txn]
        if position in self.individual_ack_positions:
            _shrink(self.individual_ack_positions, position, reservation)

    def reserve_cumulative(self, txn: TxnId, position: Position) -> None:
        if self._cumulative_txn is None:
            self._cumulative_txn = txn
        insort(self._cumulative_positions, position)

    def release_cumulative(self, txn: TxnId, position: Position) -> None:
        if self._cumulative_txn != txn or position not in self._cumulative_positions:
            return
        self._cumulative_positions.remove(position)
        if not self._cumulative_positions:
            self._cumulative_txn = None

    def acks_of(self, txn: TxnId) -> tuple[dict[Position, Reservation], Position | None]:
        """A copy of what `txn` holds: its individual reservations and cumulative position."""
        holder = self.cumulative_ack_of_txn
        cumulative = holder[1] if holder is not None and holder[0] == txn else None
        return dict(self.individual_ack_of_txn.get(txn, {})), cumulative

    def drop(self, txn: TxnId) -> None:
        """Forget everything `txn` holds (it ended)."""
        for position, reservation in list(self.individual_ack_of_txn.get(txn, {}).items()):
            self.release(txn, position, reservation)
        if self._cumulative_txn == txn:
            self._cumulative_txn = None
            self._cumulative_positions.clear()

    # --- replay ---------------------------------------------------------------------------

    def admit_replayed(self, position: Position, logged: Reservation, cursor: AckedView) -> Reservation | None:
        """What a logged reservation still holds now: without what the cursor acknowledged
        meanwhile and without what another reservation already holds; None when nothing."""
        if cursor.is_acked(position):
            return None
        held = self.individual_ack_positions.get(position)
        if logged.whole:
            return None if held is not None else logged
        if held is not None and (held.whole or held.batch_size != logged.batch_size):
            return None
        size = logged.batch_size
        full = ackset_new(size)
        free = list(logged.requested())
        acked = cursor.batch_ack_set(position)
        if acked is not None:
            free = ackset_or(free, ackset_andnot(full, acked))
        if held is not None:
            free = ackset_or(free, ackset_andnot(full, held.requested()))
        if ackset_unacked_count(free, size) == size:
            return None
        return Reservation(tuple(free), size)


def _shrink(reservations: dict[Position, Reservation], position: Position, removed: Reservation) -> None:
    rest = _without(reservations[position], removed)
    if rest is None:
        del reservations[position]
    else:
        reservations[position] = rest
