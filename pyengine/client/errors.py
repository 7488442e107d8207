"""Errors the network client raises on its own, beside the broker's (`pyengine.errors`).

Failures the broker reports arrive as their `ServerError` code and are raised as the class of
`pyengine.errors` for that code; these are the ones that happen on the client's side of the
wire (a connection that cannot be made, a handler closed under an operation, a full queue).
Timeouts are the builtin `TimeoutError`.
"""

from __future__ import annotations

from pyengine.errors import NotAllowedError, PulsarError


class ConnectError(PulsarError):
    """The broker could not be reached, or the connection broke under a request."""


class AlreadyClosedError(PulsarError):
    """The client, producer, consumer or reader was closed."""


class ProducerQueueIsFullError(PulsarError):
    """`max_pending_messages` are in flight and `block_if_queue_full` is off."""


class MessageTooBigError(PulsarError, ValueError):
    """A message larger than the broker's max message size."""


class CumulativeAcknowledgementNotAllowedError(NotAllowedError):
    """Cumulative acknowledgement on a Shared or Key_Shared subscription."""


class TransactionHasOperationFailedError(PulsarError):
    """A send or acknowledgement of the transaction did not complete (it was cancelled), so
    its commit aborted the transaction instead (the Java client's
    TransactionHasOperationFailedException)."""


class SendOutcomeUnknownError(ConnectError):
    """A send to a segment whose connection broke before its receipt came, the segment found
    terminated when the producer reconnected: the segment may have stored the message or not.
    It is not sent again to the segment's child — de-duplication works per topic, so the child
    could store it a second time; the caller decides (the sealed segment can be read to see)."""
