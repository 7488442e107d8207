"""How a topic's transaction state follows from its stream: the rules recovery replays.

Shared by the v4 `TopicTransactionBuffer` (recovery) and by read-only tools that compute the
same state from a data dir without a broker (the Spark data source): both load the snapshot,
then apply `replay_entry` to every entry after it, and derive the read horizon with
`read_horizon`. Pure functions over the kernels' containers; nothing here reads or writes
storage.
"""

from __future__ import annotations

from collections.abc import Callable

from pyengine.storage.entry import MARKER_NONE, MARKER_TXN_ABORT, MARKER_TXN_COMMIT
from pyengine.transaction import TxnAction
from pyengine.transaction.buffer.ended import EndedTxns
from pyengine.transaction.buffer.snapshot import TransactionBufferSnapshot
from pyengine_kernels import AbortedTxnSet, OngoingTxnMap, Position, TxnId


def replay_entry(ongoing: OngoingTxnMap, aborted: AbortedTxnSet, ended: EndedTxns, position: Position,
                 txn_most: int, txn_least: int, marker_type: int) -> TxnId | None:
    """Apply one stored entry (its header fields) to the state.

    An abort marker ends its txn as aborted (remembering the marker's position), a commit
    marker as committed; the first entry of a txn not known to have ended makes it ongoing
    from `position`. Returns that txn when this entry made it ongoing, else None.
    """
    if txn_most < 0:
        return None
    txn = TxnId(txn_most, txn_least)
    if marker_type == MARKER_TXN_ABORT:
        aborted.add(txn, position)
        ongoing.remove(txn)
        ended.add(txn, TxnAction.ABORT)
    elif marker_type == MARKER_TXN_COMMIT:
        ongoing.remove(txn)
        ended.add(txn, TxnAction.COMMIT)
    elif marker_type == MARKER_NONE and ended.outcome(txn) is None and txn not in aborted:
        if ongoing.add(txn, position):
            return txn
    return None


def load_snapshot(snapshot: TransactionBufferSnapshot | None, first: Position
                  ) -> tuple[AbortedTxnSet, EndedTxns, Position]:
    """The state a snapshot gives recovery, and where the replay starts: (aborted txns, ended
    txns, first position to replay). Aborts whose marker lies before `first` (the first entry
    still stored) are dropped: their entries were trimmed with it."""
    if snapshot is None:
        return AbortedTxnSet(), EndedTxns(), first
    aborted = snapshot.aborted
    aborted.trim_before(first)
    return aborted, snapshot.ended, max(first, snapshot.max_read_position.next())


def read_horizon(ongoing: OngoingTxnMap, limit: Position,
                 previous_position: Callable[[Position], Position]) -> Position:
    """The max read position: `limit` (the last entry readers may reach), or the entry just
    before the first entry of the oldest open txn if that is lower. A txn's first position
    may lie beyond `limit` (not durable yet): hence the min. `previous_position` names the
    entry before a ledger's first (the last entry of the previous non-empty ledger)."""
    if not len(ongoing):
        return limit
    horizon = ongoing.max_read_position(limit)
    if horizon >= limit:
        return limit
    if horizon.entry_id < 0:        # (L, -1): name the real entry before it
        horizon = previous_position(Position(horizon.ledger_id, 0))
    return horizon


def below_low_watermark(ongoing: OngoingTxnMap, ended: EndedTxns) -> list[TxnId]:
    """Txns still open here although their coordinator's low watermark says they ended:
    recovery aborts them (Pulsar #19200), oldest first."""
    return [txn for txn, _first in ongoing.items() if ended.is_below_low_watermark(txn)]


__all__ = ["below_low_watermark", "load_snapshot", "read_horizon", "replay_entry"]
