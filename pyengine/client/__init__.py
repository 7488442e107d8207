"""pyengine's asyncio Pulsar client (with transactions), and the message types it shares with
the embedded client."""

from pyengine.client.client import Client
from pyengine.client.consumer import Consumer
from pyengine.client.errors import (
    AlreadyClosedError, ConnectError, CumulativeAcknowledgementNotAllowedError, MessageTooBigError,
    ProducerQueueIsFullError,
)
from pyengine.client.message import Message, MessageId
from pyengine.client.producer import Producer
from pyengine.client.reader import Reader
from pyengine.client.transaction import Transaction
from pyengine.errors import ExpiredTransactionError, InvalidTransactionKeyError

__all__ = [
    "AlreadyClosedError", "Client", "ConnectError", "Consumer", "CumulativeAcknowledgementNotAllowedError",
    "ExpiredTransactionError", "InvalidTransactionKeyError", "Message", "MessageId", "MessageTooBigError", "Producer", "ProducerQueueIsFullError", "Reader", "Transaction",
]
