"""The transaction coordinator's commands on the wire (brief section 5).

Discovery is the Java client's: PARTITIONED_METADATA of the coordinators' assign topic gives
the number of coordinators, a LOOKUP of each `...-partition-<i>` names this broker, and
TC_CLIENT_CONNECT_REQUEST{tc_id=i} confirms coordinator i. Transaction ids are
(coordinator id, sequence): clients route every later request by the most significant half.

Every request is answered with its own response, errors inside it (the code of
`pyengine.errors.to_pulsar_error`). Only clients that send these requests ever receive these
responses, which the official C++ client could not handle.

Transaction keys (`pyengine.transaction.coordinator.keys`): a TC_CLIENT_CONNECT carrying
`transaction_key` (and the client's previous `epoch`, -1 the first time) takes the key's next
epoch for this connection and answers it in `epoch`; without the field the connect is what it
always was. NEW_TXN on that coordinator then starts the key's transaction under the epoch, and
every TC request over the connection is refused (NotAllowed) once a newer epoch took the key.
The owner of a key is the connection's authenticated role; this broker does not authenticate,
so it is `anonymous`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from dataclasses import dataclass

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
from pyengine.transaction.coordinator.keys import ANONYMOUS, NO_EPOCH
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


@dataclass
class KeySession:
    """The transaction key this connection holds an epoch of, on one coordinator."""

    owner: str
    key: str
    epoch: int


class TransactionCommands:
    def __init__(self, connection: ServerConnection) -> None:
        self.connection = connection
        self.coordinator = connection.service.coordinator
        self.sessions: dict[int, KeySession] = {}          # coordinator id -> key session
        self._connecting: dict[int, tuple[str, str, int]] = {}   # coordinator id -> (owner, key, connects under way)

    @property
    def owner(self) -> str:
        return getattr(self.connection, "auth_role", None) or ANONYMOUS

    def connection_closed(self) -> None:
        for session in self.sessions.values():
            self.coordinator.keys.disconnected(session.owner, session.key, self.connection)

    def _check_session(self, coordinator_id: int) -> KeySession | None:
        """NotAllowed when this connection's epoch of its key on `coordinator_id` was fenced."""
        session = self.sessions.get(coordinator_id)
        if session is not None:
            self.coordinator.keys.check_epoch(session.owner, session.key, session.epoch)
        return session

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
        if not self.coordinator.serves(body.tc_id):
            failure = TransactionCoordinatorNotFoundError(
                f"transaction coordinator {body.tc_id} is not served by this broker")
        elif body.HasField("transaction_key"):
            await self._connect_key(body)
            return
        self._answer(BaseCommand.TC_CLIENT_CONNECT_RESPONSE, body.request_id, None, failure)

    async def _connect_key(self, body: pb.CommandTcClientConnectRequest) -> None:
        owner, key = self.owner, body.transaction_key
        presented = body.epoch if body.HasField("epoch") else NO_EPOCH
        # One key per coordinator on a connection: NEW_TXN names no key, and a second key's
        # session replaced the first one's, which then kept this connection as its holder after
        # it closed. Refused before an epoch is taken (also while one is being taken).
        session, connecting = self.sessions.get(body.tc_id), self._connecting.get(body.tc_id)
        held = (session.owner, session.key) if session is not None else connecting[:2] if connecting else None
        if held is not None and held != (owner, key):
            self._answer(BaseCommand.TC_CLIENT_CONNECT_RESPONSE, body.request_id, None, NotAllowedError(
                f"this connection holds transaction key {held[1]!r} on coordinator {body.tc_id}; "
                f"key {key!r} needs a connection of its own"))
            return
        self._connecting[body.tc_id] = (owner, key, (connecting[2] if connecting else 0) + 1)
        try:
            epoch = await self.coordinator.keys.connect(owner, key, body.tc_id, presented,
                                                        holder=self.connection, on_fenced=self.connection.close)
        except Exception as exc:
            self._answer(BaseCommand.TC_CLIENT_CONNECT_RESPONSE, body.request_id, None, exc)
            return
        finally:
            pending = self._connecting[body.tc_id][2] - 1
            if pending:
                self._connecting[body.tc_id] = (owner, key, pending)
            else:
                del self._connecting[body.tc_id]
        if self.connection.closed:           # closed while the epoch was taken: it holds nothing
            self.coordinator.keys.disconnected(owner, key, self.connection)
            return
        self.sessions[body.tc_id] = KeySession(owner, key, epoch)
        self.connection.write(replies.tc_client_connect_response(body.request_id, epoch))

    async def new_txn(self, body: pb.CommandNewTxn) -> None:
        # txn_ttl_seconds carries milliseconds (the Java and Go clients, Apache's broker).
        try:
            session = self._check_session(body.tc_id)
            if session is not None:
                txn = await self.coordinator.keys.new_transaction(session.owner, session.key, session.epoch,
                                                                  body.tc_id, body.txn_ttl_seconds)
            else:
                txn = await self.coordinator.new_transaction(body.tc_id, body.txn_ttl_seconds)
        except Exception as exc:
            self._answer(BaseCommand.NEW_TXN_RESPONSE, body.request_id, None, exc)
            return
        self._answer(BaseCommand.NEW_TXN_RESPONSE, body.request_id, txn, None)

    def add_partition_to_txn(self, body: pb.CommandAddPartitionToTxn) -> Coroutine[Any, Any, None] | None:
        return self._register(BaseCommand.ADD_PARTITION_TO_TXN_RESPONSE, body, lambda txn: (
            self.coordinator.add_produced_partitions_now(txn, [normalize_topic(name) for name in body.partitions])))

    def add_subscription_to_txn(self, body: pb.CommandAddSubscriptionToTxn) -> Coroutine[Any, Any, None] | None:
        return self._register(BaseCommand.ADD_SUBSCRIPTION_TO_TXN_RESPONSE, body, lambda txn: (
            self.coordinator.add_acked_subscriptions_now(
                txn, [(normalize_topic(s.topic), s.subscription) for s in body.subscription])))

    def _register(self, response: int, body: pb.CommandAddPartitionToTxn | pb.CommandAddSubscriptionToTxn,
                  register: Callable[[TxnId], Awaitable[None] | None]) -> Coroutine[Any, Any, None] | None:
        """Answer a registration in the turn its frame arrived (no task: the client's sends wait
        for this answer) when the coordinator took it at once (v4); otherwise return what
        answers it once the coordinator is done (v5), for the connection to run as a task."""
        txn = None
        try:
            txn = txn_id(body.txnid_most_bits, body.txnid_least_bits)
            self._check_txn_session(txn)
            waiting = register(txn)
        except Exception as exc:
            self._answer(response, body.request_id, txn, exc)
            return None
        if waiting is None:
            self._answer(response, body.request_id, txn, None)
            return None
        return self._answer_when_done(waiting, response, body.request_id, txn)

    async def _answer_when_done(self, waiting: Awaitable[None], response: int, request_id: int, txn: TxnId) -> None:
        try:
            await waiting
        except Exception as exc:
            self._answer(response, request_id, txn, exc)
            return
        self._answer(response, request_id, txn, None)

    async def end_txn(self, body: pb.CommandEndTxn) -> None:
        txn = None
        try:
            txn = txn_id(body.txnid_most_bits, body.txnid_least_bits)
            # Unset (or an unknown value, which proto2 keeps aside) reads as COMMIT, the
            # enum's default: a malformed request must not commit.
            if not body.HasField("txn_action"):
                raise NotAllowedError("END_TXN needs a txn_action: COMMIT or ABORT")
            # The txn's fence is the coordinator's to check: the repeat of a commit decided
            # before the fence is answered with the truth (committed), not as expired.
            try:
                self._check_session(txn.most_bits)
            except NotAllowedError:
                self.coordinator.keys.check_txn(txn)      # a fenced txn's request: expired, first
                raise
            await self.coordinator.end_transaction(txn, TxnAction(body.txn_action))
        except Exception as exc:
            self._answer(BaseCommand.END_TXN_RESPONSE, body.request_id, txn, exc)
            return
        self._answer(BaseCommand.END_TXN_RESPONSE, body.request_id, txn, None)

    def _check_txn_session(self, txn: TxnId) -> None:
        """A request of a fenced txn is ExpiredTransaction; any other TC request over a fenced
        epoch's connection is NotAllowed."""
        self.coordinator.keys.check_txn(txn)
        self._check_session(txn.most_bits)

    async def end_txn_on_partition(self, body: pb.CommandEndTxnOnPartition) -> None:
        # Broker-to-broker in Apache (super-user only); here the coordinator reaches its
        # participants in-process, and a client must not end a txn on one partition alone.
        self._answer(BaseCommand.END_TXN_ON_PARTITION_RESPONSE, body.request_id, None,
                     NotAllowedError("END_TXN_ON_PARTITION is internal to the broker"))

    async def end_txn_on_subscription(self, body: pb.CommandEndTxnOnSubscription) -> None:
        self._answer(BaseCommand.END_TXN_ON_SUBSCRIPTION_RESPONSE, body.request_id, None,
                     NotAllowedError("END_TXN_ON_SUBSCRIPTION is internal to the broker"))
