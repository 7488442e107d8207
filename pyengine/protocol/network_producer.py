"""A producer attached over the network, and the order of its answers.

The client matches SEND_RECEIPT / SEND_ERROR strictly in send order (an answer above the oldest
pending send makes it drop the connection), while the engine resolves sends in its own order: a
de-duplicated send is answered at once, a transactional one waits for its coordinator record.
So every send takes a place in a queue, and answers leave from its head only.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING

from pyengine.broker.topic import Producer, Topic
from pyengine.errors import TopicTerminatedError, to_pulsar_error
from pyengine.protocol import replies
from pyengine_kernels import Position

if TYPE_CHECKING:
    from pyengine.protocol.connection import ServerConnection

log = logging.getLogger(__name__)


class _PendingSend:
    __slots__ = ("sequence_id", "highest_sequence_id", "outcome", "error", "size")

    def __init__(self, sequence_id: int, highest_sequence_id: int,
                 outcome: asyncio.Future[Position | None] | None, error: bytes | None, size: int = 0) -> None:
        self.sequence_id = sequence_id
        self.highest_sequence_id = highest_sequence_id
        self.outcome = outcome          # the engine's future (None when `error` answers it)
        self.error = error              # a ready SEND_ERROR frame
        self.size = size                # its bytes in the broker's publish buffer


class NetworkProducer:
    def __init__(self, connection: ServerConnection, producer_id: int, topic: Topic, producer: Producer | None,
                 *, epoch: int, exclusive: bool, schema_version: bytes = b"", name: str = "") -> None:
        """`producer`: the topic's producer, or None until it is attached (`attach`: the access
        mode is granted first, then the name is taken, as in Pulsar)."""
        self.connection = connection
        self.schema_version = schema_version    # of its schema (PRODUCER_SUCCESS; empty: none)
        self.producer_id = producer_id
        self.topic = topic
        self.producer: Producer = producer      # type: ignore[assignment]
        self._name = name
        self.epoch = epoch              # the client's reconnect counter (CommandProducer.epoch)
        self.exclusive = exclusive      # holds the topic's exclusive access
        self.closed = False
        self._pending: deque[_PendingSend] = deque()

    @property
    def name(self) -> str:
        return self.producer.name if self.producer is not None else self._name

    def attach(self, producer: Producer) -> None:
        self.producer = producer

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def track(self, sequence_id: int, highest_sequence_id: int, outcome: asyncio.Future[Position | None],
              size: int) -> None:
        """Queue the answer to a send of `size` bytes that the engine is storing."""
        pending = _PendingSend(sequence_id, highest_sequence_id, outcome, None, size)
        self._pending.append(pending)
        self.connection.sends_started(1, size)
        if outcome.done():
            self._drain()
        else:
            outcome.add_done_callback(self._settled)

    def reject(self, sequence_id: int, code: int, message: str) -> None:
        """Queue a SEND_ERROR behind the answers still pending."""
        frame = replies.send_error(self.producer_id, sequence_id, code, message)
        if not self._pending:
            self.connection.write(frame)
            return
        self._pending.append(_PendingSend(sequence_id, sequence_id, None, frame))

    def _settled(self, _future: asyncio.Future) -> None:
        self._drain()

    def _drain(self) -> None:
        pending = self._pending
        frames: list[bytes] = []
        finished = finished_size = 0
        while pending:
            head = pending[0]
            outcome = head.outcome
            if outcome is not None:
                if not outcome.done():
                    break
                finished += 1
                finished_size += head.size
                frames.append(self._answer(head, outcome))
            else:
                frames.append(head.error)       # type: ignore[arg-type]
            pending.popleft()
        if finished:
            self.connection.sends_finished(finished, finished_size)
        if frames and not self.closed:
            self.connection.write_many(frames)

    def _answer(self, pending: _PendingSend, outcome: asyncio.Future[Position | None]) -> bytes:
        if outcome.cancelled():
            return replies.send_error(self.producer_id, pending.sequence_id, 0, "the send was cancelled")
        failure = outcome.exception()
        if failure is not None:
            error = to_pulsar_error(failure)
            # A send refused by a terminated topic is the expected end of a sealed segment
            # (the client re-routes it), one per in-flight send: as Pulsar, no warning for it.
            log.log(logging.DEBUG if isinstance(error, TopicTerminatedError) else logging.WARNING,
                    "send %d of producer %s on %s failed: %s", pending.sequence_id, self.name,
                    self.topic.name, error)
            return replies.send_error(self.producer_id, pending.sequence_id, error.server_error, str(error))
        return replies.send_receipt(self.producer_id, pending.sequence_id, pending.highest_sequence_id,
                                    outcome.result())

    def close(self) -> None:
        """Detach from the topic; sends still being stored finish, their answers are dropped."""
        if self.closed:
            return
        self.closed = True
        if self.producer is not None:
            self.topic.remove_producer(self.producer)

    async def wait_idle(self) -> None:
        """Wait until every queued send is stored (or failed), and answer them: a send settled
        before this ran may have its answer's callback still queued behind it, which would find
        the producer closed and drop it."""
        outcomes = [p.outcome for p in self._pending if p.outcome is not None and not p.outcome.done()]
        if outcomes:
            await asyncio.wait(outcomes)
        self._drain()
