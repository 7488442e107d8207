"""The errors pyengine reports to its users, one class per Pulsar `ServerError` code.

The broker raises them internally, sends their code on the wire, and both clients (the
embedded one and `pyengine.client`) raise the same classes, so code written against one works
against the other.
"""

from __future__ import annotations

from pyengine.protocol.pulsar_api_pb2 import ServerError


class PulsarError(Exception):
    """Base class: `server_error` is the wire code (pulsar_api.ServerError)."""

    server_error: int = ServerError.UnknownError

    @classmethod
    def from_code(cls, code: int, message: str) -> PulsarError:
        return _BY_CODE.get(code, PulsarError)(message)


class MetadataError(PulsarError):
    server_error = ServerError.MetadataError


class PersistenceError(PulsarError):
    server_error = ServerError.PersistenceError


class IncompatibleSchemaError(PulsarError):
    """A schema the topic's schema registry refuses: incompatible with its schemas, or invalid."""

    server_error = ServerError.IncompatibleSchema


class ConsumerBusyError(PulsarError):
    server_error = ServerError.ConsumerBusy


class ConsumerAssignError(PulsarError):
    """A Key_Shared Sticky consumer whose hash ranges are empty, reversed, or overlap the ranges
    of another consumer of the subscription (Pulsar's ConsumerAssignException)."""

    server_error = ServerError.ConsumerAssignError


class ServiceNotReadyError(PulsarError):
    server_error = ServerError.ServiceNotReady


class TopicFencedError(ServiceNotReadyError):
    """The topic is closed (being unloaded or deleted): as Pulsar's TopicFencedException,
    ServiceNotReady on the wire, which clients retry (they find the topic loaded again, or
    created again after its deletion)."""


class ChecksumError(PulsarError):
    server_error = ServerError.ChecksumError


class TopicNotFoundError(PulsarError):
    server_error = ServerError.TopicNotFound


class SubscriptionNotFoundError(PulsarError):
    server_error = ServerError.SubscriptionNotFound


class ConsumerNotFoundError(PulsarError):
    server_error = ServerError.ConsumerNotFound


class TooManyRequestsError(PulsarError):
    server_error = ServerError.TooManyRequests


class TopicTerminatedError(PulsarError):
    server_error = ServerError.TopicTerminatedError


class ProducerBusyError(PulsarError):
    server_error = ServerError.ProducerBusy


class ProducerBlockedQuotaExceededError(PulsarError):
    """A producer refused by a producer_request_hold backlog quota (its client retries)."""

    server_error = ServerError.ProducerBlockedQuotaExceededError


class ProducerBlockedQuotaExceededException(PulsarError):
    """A producer refused by a producer_exception backlog quota (its client gives up)."""

    server_error = ServerError.ProducerBlockedQuotaExceededException


class InvalidTopicNameError(PulsarError, ValueError):
    server_error = ServerError.InvalidTopicName


class NotAllowedError(PulsarError):
    server_error = ServerError.NotAllowedError


class InvalidSubscriptionNameError(NotAllowedError, ValueError):
    """An empty or malformed subscription name (the wire has no code of its own for it)."""


class InvalidSubscriptionPropertiesError(NotAllowedError, ValueError):
    """Subscription properties that cannot be kept: text that is not UTF-8, or too much of it."""


class ProducerFencedError(PulsarError):
    server_error = ServerError.ProducerFenced


class TransactionCoordinatorNotFoundError(PulsarError):
    server_error = ServerError.TransactionCoordinatorNotFound


class InvalidTxnStatusError(PulsarError):
    server_error = ServerError.InvalidTxnStatus


class TransactionConflictError(PulsarError):
    server_error = ServerError.TransactionConflict


class TransactionNotFoundError(PulsarError):
    server_error = ServerError.TransactionNotFound


class ExpiredTransactionError(PulsarError):
    """A send, ack or end of a transaction whose transaction key has since been connected under
    a newer epoch: the transaction was aborted then, and nothing of it can land any more."""

    server_error = ServerError.ExpiredTransaction


class InvalidTransactionKeyError(NotAllowedError, ValueError):
    """An empty transaction key, one over 256 characters or one containing '&' (the wire has no
    code of its own for it: NotAllowed)."""


_BY_CODE: dict[int, type[PulsarError]] = {
    cls.server_error: cls
    for cls in (MetadataError, PersistenceError, ConsumerBusyError, ConsumerAssignError, ServiceNotReadyError, ChecksumError,
                TopicNotFoundError, SubscriptionNotFoundError, ConsumerNotFoundError, TooManyRequestsError,
                TopicTerminatedError, ProducerBusyError, InvalidTopicNameError, IncompatibleSchemaError,
                NotAllowedError, ProducerBlockedQuotaExceededError, ProducerBlockedQuotaExceededException,
                ProducerFencedError, TransactionCoordinatorNotFoundError, InvalidTxnStatusError,
                TransactionConflictError, TransactionNotFoundError, ExpiredTransactionError)
}


def to_pulsar_error(error: BaseException) -> PulsarError:
    """The error a user sees for an internal failure: storage errors become PersistenceError
    (or TopicTerminatedError); anything unexpected is an UnknownError with its message."""
    from pyengine import storage

    if isinstance(error, PulsarError):
        return error
    if isinstance(error, storage.TopicTerminatedError):
        return TopicTerminatedError(str(error))
    if isinstance(error, storage.StorageError):
        return PersistenceError(str(error))
    return PulsarError(f"{type(error).__name__}: {error}")
