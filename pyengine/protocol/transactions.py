"""The transaction coordinator's commands on the wire (brief section 5).

Discovery is the Java client's: PARTITIONED_METADATA of the coordinators' assign topic gives
the number of coordinators, a LOOKUP of each `...-partition-<i>` names this broker, and
TC_CLIENT_CONNECT_REQUEST{tc_id=i} confirms coordinator i. Transaction ids are
(coordinator id, sequence): clients route every later request by the most significant half.

Every request is answered with its own response, errors inside it (the code of
`pyengine.errors.to_pulsar_error`). Only clients that send these requests ever receive these
responses, which the official C++ client could not handle.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from pyengine.errors import (
    NotAllowedError,
    TransactionCoordinatorNotFoundError,
    TransactionNotFoundError,
    to_pulsar_error,
)
from pyengine.naming import normalize_topic
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol import replies
from pyengine.transaction import TxnAction
from pyengine_kernels import TxnId

if TYPE_CHECKING:
    from pyengine.protocol.connection import ServerConnection

log = logging.getLogger(__name__)
BaseCommand = pb.BaseCommand


def txn_id(most: int, least: int) -> TxnId:
    """The TxnId of the wire's two uint64 halves (TransactionNotFound if not a valid id)."""
    try:
        return TxnId(most, least)
    except (ValueError, OverflowError):
        raise TransactionNotFoundError(f"({most},{least}) is not a transaction id") from None


class TransactionCommands:
    def __init__(self, connection: ServerConnection) -> None:
        self.connection = connection
        self.coordinator = connection.service.coordinator

    def _answer(self, type_: int, request_id: int, txn: TxnId | None, failure: BaseException | None) -> None:
        if failure is None:
            self.connection.write(replies.txn_response(type_, request_id, txn))
            return
        error = to_pulsar_error(failure)
        if error.server_error == pb.UnknownError:
            log.error("answering with %s: unexpected failure", BaseCommand.Type.Name(type_), exc_info=failure)
        self.connection.write(replies.txn_response(type_, request_id, txn, error.server_error, str(error)))

    async def tc_client_connect(self, body: pb.CommandTcClientConnectRequest) -> None:
        failure = None
        if body.tc_id not in self.coordinator.coordinator_ids:
            failure = TransactionCoordinatorNotFoundError(
                f"transaction coordinator {body.tc_id} is not served by this broker")
        self._answer(BaseCommand.TC_CLIENT_CONNECT_RESPONSE, body.request_id, None, failure)

    async def new_txn(self, body: pb.CommandNewTxn) -> None:
        # txn_ttl_seconds carries milliseconds (the Java and Go clients, Apache's broker).
        try:
            txn = await self.coordinator.new_transaction(body.tc_id, body.txn_ttl_seconds)
        except Exception as exc:
            self._answer(BaseCommand.NEW_TXN_RESPONSE, body.request_id, None, exc)
            return
        self._answer(BaseCommand.NEW_TXN_RESPONSE, body.request_id, txn, None)

    async def add_partition_to_txn(self, body: pb.CommandAddPartitionToTxn) -> None:
        txn = None
        try:
            txn = txn_id(body.txnid_most_bits, body.txnid_least_bits)
            partitions = [normalize_topic(name) for name in body.partitions]
            await self.coordinator.add_produced_partitions(txn, partitions)
        except Exception as exc:
            self._answer(BaseCommand.ADD_PARTITION_TO_TXN_RESPONSE, body.request_id, txn, exc)
            return
        self._answer(BaseCommand.ADD_PARTITION_TO_TXN_RESPONSE, body.request_id, txn, None)

    async def add_subscription_to_txn(self, body: pb.CommandAddSubscriptionToTxn) -> None:
        txn = None
        try:
            txn = txn_id(body.txnid_most_bits, body.txnid_least_bits)
            subscriptions = [(normalize_topic(s.topic), s.subscription) for s in body.subscription]
            await self.coordinator.add_acked_subscriptions(txn, subscriptions)
        except Exception as exc:
            self._answer(BaseCommand.ADD_SUBSCRIPTION_TO_TXN_RESPONSE, body.request_id, txn, exc)
            return
        self._answer(BaseCommand.ADD_SUBSCRIPTION_TO_TXN_RESPONSE, body.request_id, txn, None)

    async def end_txn(self, body: pb.CommandEndTxn) -> None:
        txn = None
        try:
            txn = txn_id(body.txnid_most_bits, body.txnid_least_bits)
            await self.coordinator.end_transaction(txn, TxnAction(body.txn_action))
        except Exception as exc:
            self._answer(BaseCommand.END_TXN_RESPONSE, body.request_id, txn, exc)
            return
        self._answer(BaseCommand.END_TXN_RESPONSE, body.request_id, txn, None)

    async def end_txn_on_partition(self, body: pb.CommandEndTxnOnPartition) -> None:
        # Broker-to-broker in Apache (super-user only); here the coordinator reaches its
        # participants in-process, and a client must not end a txn on one partition alone.
        self._answer(BaseCommand.END_TXN_ON_PARTITION_RESPONSE, body.request_id, None,
                     NotAllowedError("END_TXN_ON_PARTITION is internal to the broker"))

    async def end_txn_on_subscription(self, body: pb.CommandEndTxnOnSubscription) -> None:
        self._answer(BaseCommand.END_TXN_ON_SUBSCRIPTION_RESPONSE, body.request_id, None,
                     NotAllowedError("END_TXN_ON_SUBSCRIPTION is internal to the broker"))
