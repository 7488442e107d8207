"""pyengine's asyncio Pulsar client (with transactions), and the message types it shares with
the embedded client.

Every error the client raises can be imported from here: the broker's errors (one class per
Pulsar `ServerError` code, defined in `pyengine.errors` and shared with the embedded client)
and the client's own (`pyengine.client.errors`). They are the same classes, not copies, so
`except pyengine.client.TransactionConflictError` catches what `pyengine.errors` names so.
"""

from pyengine.client.client import Client
from pyengine.client.consumer import Consumer, ConsumerBatchReceivePolicy, ConsumerKeySharedPolicy, KeySharedMode
from pyengine.client.dead_letter import ConsumerDeadLetterPolicy
from pyengine.client.errors import (
    AlreadyClosedError, ConnectError, CumulativeAcknowledgementNotAllowedError, MessageTooBigError,
    ProducerQueueIsFullError, SendOutcomeUnknownError, TransactionHasOperationFailedError,
)
from pyengine.client.key_batching import BatchingType
from pyengine.client.message import Message, MessageId
from pyengine.client.pattern import MultiTopicsConsumer
from pyengine.client.producer import CompressionType, Producer
from pyengine.client.reader import Reader
from pyengine.client.transaction import Transaction
from pyengine.schema import SchemaData, SchemaInfo, SchemaType
from pyengine.errors import (
    ChecksumError, ConsumerAssignError, ConsumerBusyError, ConsumerNotFoundError, ExpiredTransactionError, IncompatibleSchemaError,
    InvalidSubscriptionNameError, InvalidSubscriptionPropertiesError,
    InvalidTopicNameError, InvalidTransactionKeyError, InvalidTxnStatusError, MetadataError, NotAllowedError,
    PersistenceError, ProducerBlockedQuotaExceededError, ProducerBlockedQuotaExceededException, ProducerBusyError,
    ProducerFencedError, PulsarError, ServiceNotReadyError, SubscriptionNotFoundError, TooManyRequestsError, TopicFencedError, TopicNotFoundError,
    TopicTerminatedError,
    TransactionConflictError, TransactionCoordinatorNotFoundError, TransactionNotFoundError,
)

__all__ = [
    # the client
    "BatchingType", "Client", "CompressionType", "Consumer", "ConsumerBatchReceivePolicy", "ConsumerDeadLetterPolicy", "ConsumerKeySharedPolicy", "KeySharedMode", "Message", "MessageId", "MultiTopicsConsumer", "Producer", "Reader", "Transaction",
    # schemas (payloads stay bytes: the schema is declared to the broker's registry)
    "SchemaData", "SchemaInfo", "SchemaType",
    # errors of the client's side of the wire
    "AlreadyClosedError", "ConnectError", "CumulativeAcknowledgementNotAllowedError", "MessageTooBigError",
    "SendOutcomeUnknownError",
    "ProducerQueueIsFullError", "TransactionHasOperationFailedError",
    # the broker's errors
    "ChecksumError", "ConsumerAssignError", "ConsumerBusyError", "ConsumerNotFoundError", "ExpiredTransactionError", "IncompatibleSchemaError",
    "InvalidSubscriptionNameError", "InvalidSubscriptionPropertiesError", "InvalidTopicNameError", "InvalidTransactionKeyError", "InvalidTxnStatusError",
    "MetadataError", "NotAllowedError", "PersistenceError", "ProducerBlockedQuotaExceededError",
    "ProducerBlockedQuotaExceededException", "ProducerBusyError", "ProducerFencedError", "PulsarError",
    "ServiceNotReadyError", "SubscriptionNotFoundError", "TooManyRequestsError", "TopicFencedError",
    "TopicNotFoundError", "TopicTerminatedError", "TransactionConflictError", "TransactionCoordinatorNotFoundError",
    "TransactionNotFoundError",
]
