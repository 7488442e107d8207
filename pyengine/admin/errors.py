"""How the admin API reports failures: a JSON body `{"reason": "..."}` (Pulsar's ErrorData)
with the HTTP status Pulsar's admin API uses for the same failure.

Routes raise `AdminError` for what only they know (a partitioned topic where a plain one is
expected, ...); engine errors are mapped by class. Anything else is a bug: 500, logged.
"""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

from pyengine.broker.policies import ConflictError, NotFoundError
from pyengine.metadata import BadVersionError as MetadataBadVersionError
from pyengine.metadata import NotFoundError as MetadataNotFoundError
from pyengine.scalable.controller import NotLeaderError
from pyengine.scalable.layout import LayoutError, SegmentNotFoundError
from pyengine.schema import InvalidSchemaDataError
from pyengine.storage.errors import LedgerClosedError
from pyengine.errors import (
    ConsumerBusyError,
    IncompatibleSchemaError,
    InvalidSubscriptionPropertiesError,
    InvalidTopicNameError,
    InvalidTxnStatusError,
    NotAllowedError,
    ProducerBusyError,
    ServiceNotReadyError,
    SubscriptionNotFoundError,
    TopicNotFoundError,
    TopicTerminatedError,
    TransactionCoordinatorNotFoundError,
    TransactionNotFoundError,
)

BAD_REQUEST = 400
NOT_FOUND = 404
METHOD_NOT_ALLOWED = 405
NOT_ACCEPTABLE = 406
CONFLICT = 409
PRECONDITION_FAILED = 412
UNPROCESSABLE = 422
INTERNAL_ERROR = 500
UNAVAILABLE = 503


class AdminError(Exception):
    """A request the admin API refuses, with the HTTP status to answer."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


# Most specific first: InvalidTopicNameError is also a ValueError.
_STATUS_BY_ERROR: tuple[tuple[type[Exception], int], ...] = (
    (InvalidTopicNameError, PRECONDITION_FAILED),        # Pulsar: "... name is not valid"
    (InvalidSubscriptionPropertiesError, BAD_REQUEST),   # a malformed body (also a NotAllowedError)
    (InvalidSchemaDataError, UNPROCESSABLE),             # Pulsar's InvalidSchemaDataException
    (IncompatibleSchemaError, CONFLICT),
    (NotFoundError, NOT_FOUND),
    (MetadataNotFoundError, NOT_FOUND),                  # a scalable topic that does not exist
    (SegmentNotFoundError, NOT_FOUND),
    (LayoutError, PRECONDITION_FAILED),                  # Pulsar: "Segment is not active or cannot be split"
    (MetadataBadVersionError, CONFLICT),                 # exists already / changed concurrently
    (NotLeaderError, UNAVAILABLE),                       # the controller leader is elsewhere or not elected
    (TopicNotFoundError, NOT_FOUND),
    (SubscriptionNotFoundError, NOT_FOUND),
    (TransactionNotFoundError, NOT_FOUND),
    (TransactionCoordinatorNotFoundError, NOT_FOUND),
    (ConflictError, CONFLICT),
    (InvalidTxnStatusError, CONFLICT),                   # Pulsar: "Concurrent modification"
    (ProducerBusyError, CONFLICT),
    (ConsumerBusyError, CONFLICT),
    (NotAllowedError, METHOD_NOT_ALLOWED),               # Pulsar's NotAllowedException
    (TopicTerminatedError, METHOD_NOT_ALLOWED),
    (ServiceNotReadyError, UNAVAILABLE),
    # Only a topic's close closes its ledger and cursors: deleted (or the broker closing) meanwhile.
    (LedgerClosedError, NOT_FOUND),
    (ValueError, BAD_REQUEST),                           # the engine's argument checks
)


def status_of(error: Exception) -> int:
    """The HTTP status for an error raised by the engine (500 when it is not a known one)."""
    if isinstance(error, AdminError):
        return error.status
    for error_class, status in _STATUS_BY_ERROR:
        if isinstance(error, error_class):
            return status
    return INTERNAL_ERROR


def error_response(status: int, reason: str, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.json_response({"reason": reason}, status=status, headers=headers)
