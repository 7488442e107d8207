"""What the application of an Exclusive/Failover consumer holds, for transactional cumulative acks.

An ack names only where it ends. When the broker sends again messages the application already
holds (after a reconnect, or when it rewinds on its own: a transaction the coordinator aborted
on its timeout gives back what its acks held, and the client hears of it only later), a
transaction that acked them cumulatively would be accepted, and the next one would take the new
copies and commit their processing a second time. So the consumer keeps the span of messages
handed out since the stream last started over (`handed`) and the span handed out before it
came again (`stale`); a transactional cumulative ack that covers a stale message is refused
(the transaction aborts, the messages come again). Shared by the network client's consumer and
the embedding API's.
"""

from __future__ import annotations

from typing import Protocol

Key = tuple[int, int, float]        # (ledger, entry, batch index): the order of messages


class _Id(Protocol):
    ledger_id: int
    entry_id: int
    batch_index: int


def order_key(message_id: _Id) -> Key:
    return message_id.ledger_id, message_id.entry_id, message_id.batch_index


class HeldMessages:
    """The spans (first, last) of the messages handed out and not covered by a cumulative ack
    yet: since the stream last came again (`handed`), and before (`stale`)."""

    __slots__ = ("handed", "stale")

    def __init__(self) -> None:
        self.handed: tuple[Key, Key] | None = None
        self.stale: tuple[Key, Key] | None = None

    def handed_out(self, message_id: _Id) -> None:
        key = order_key(message_id)
        handed = self.handed
        self.handed = (key, key) if handed is None else (min(handed[0], key), max(handed[1], key))

    def sent_again(self) -> None:
        """The broker sends again what the application holds, without its asking."""
        handed, stale = self.handed, self.stale
        if handed is not None:
            self.stale = handed if stale is None else (min(stale[0], handed[0]), max(stale[1], handed[1]))
            self.handed = None

    def covered_up_to(self, message_id: _Id) -> None:
        """A cumulative ack of `message_id` settled (or was refused) what was held up to it."""
        key = order_key(message_id)
        after = (key[0], key[1], key[2] + 0.5)
        handed, stale = self.handed, self.stale
        if handed is not None:
            self.handed = None if handed[1] <= key else (max(handed[0], after), handed[1])
        if stale is not None:
            self.stale = None if stale[1] <= key else (max(stale[0], after), stale[1])

    def covers_stale(self, message_id: _Id) -> bool:
        """Whether a cumulative ack of `message_id` covers a stale message. When it does, the
        ack is refused: the span it covers is settled (`covered_up_to`)."""
        stale = self.stale
        if stale is not None and stale[0] <= order_key(message_id):
            self.covered_up_to(message_id)
            return True
        return False
