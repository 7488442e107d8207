"""Transaction commands on the wire, as the Java and Go clients drive them (brief section 5),
with the answers of the brief's section 5.6 table."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import SimpleNamespace

import pytest

from pyengine.broker.policies import TC_ASSIGN_TOPIC
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.server import ProtocolServer
from pyengine.protocol.transactions import TransactionCommands
from pyengine.transaction import TxnAction
from pyengine_kernels import Position, TxnId
from tests.broker.helpers import GatedWriter
from tests.protocol.conftest import NUM_COORDINATORS
from tests.protocol.wire_driver import BaseCommand, WireClient, metadata

Connect = Callable[..., Awaitable[WireClient]]
TOPIC = "persistent://public/default/txn"
COMMIT, ABORT = TxnAction.COMMIT, TxnAction.ABORT


class Txn:
    """A transaction driven over the raw protocol, request ids from one counter."""

    def __init__(self, client: WireClient, most: int, least: int) -> None:
        self.client = client
        self.bits = {"txnid_most_bits": most, "txnid_least_bits": least}

    async def request(self, type_: str, **fields: object) -> object:
        return await self.client.request(type_, request_id=_next_id(), **self.bits, **fields)

    async def end(self, action: TxnAction) -> object:
        return await self.request("END_TXN", txn_action=int(action))


_ids = iter(range(1, 1 << 30))


def _next_id() -> int:
    return next(_ids)


async def new_txn(client: WireClient, tc_id: int = 0, ttl_ms: int = 60_000) -> Txn:
    reply = await client.request("NEW_TXN", request_id=_next_id(), tc_id=tc_id, txn_ttl_seconds=ttl_ms)
    assert isinstance(reply, pb.CommandNewTxnResponse) and not reply.HasField("error"), reply
    assert reply.txnid_most_bits == tc_id
    return Txn(client, reply.txnid_most_bits, reply.txnid_least_bits)


async def test_coordinator_discovery_as_the_java_client_does_it(server: ProtocolServer, client: WireClient) -> None:
    meta = await client.request("PARTITIONED_METADATA", topic=TC_ASSIGN_TOPIC, request_id=1)
    assert meta.partitions == NUM_COORDINATORS
    for tc_id in range(meta.partitions):
        lookup = await client.request("LOOKUP", topic=f"{TC_ASSIGN_TOPIC}-partition-{tc_id}", request_id=2)
        assert lookup.brokerServiceUrl == f"pulsar://127.0.0.1:{server.port}"
        reply = await client.request("TC_CLIENT_CONNECT_REQUEST", request_id=10 + tc_id, tc_id=tc_id)
        assert isinstance(reply, pb.CommandTcClientConnectResponse)
        assert (reply.request_id, reply.HasField("error")) == (10 + tc_id, False)


async def test_an_unknown_coordinator_is_not_found(client: WireClient) -> None:
    reply = await client.request("TC_CLIENT_CONNECT_REQUEST", request_id=1, tc_id=5)
    assert (reply.request_id, reply.error) == (1, pb.TransactionCoordinatorNotFound)
    reply = await client.request("NEW_TXN", request_id=2, tc_id=5, txn_ttl_seconds=1000)
    assert isinstance(reply, pb.CommandNewTxnResponse)
    assert (reply.request_id, reply.error) == (2, pb.TransactionCoordinatorNotFound)


async def test_transaction_ids_count_per_coordinator(client: WireClient) -> None:
    first, second = await new_txn(client, 0), await new_txn(client, 0)
    assert first.bits["txnid_least_bits"] + 1 == second.bits["txnid_least_bits"]
    third = await new_txn(client, 3)
    assert third.bits["txnid_most_bits"] == 3


async def test_a_transaction_without_a_timeout_is_refused(client: WireClient) -> None:
    reply = await client.request("NEW_TXN", request_id=1, tc_id=0)
    assert reply.error == pb.NotAllowedError


async def test_end_txn_answers(client: WireClient) -> None:
    txn = await new_txn(client)
    aborted = await txn.end(ABORT)
    assert isinstance(aborted, pb.CommandEndTxnResponse) and not aborted.HasField("error")
    assert (aborted.txnid_most_bits, aborted.txnid_least_bits) == (0, txn.bits["txnid_least_bits"])
    assert not (await txn.end(ABORT)).HasField("error")                  # repeated: idempotent
    assert (await txn.end(COMMIT)).error == pb.InvalidTxnStatus          # the other decision
    missing = Txn(client, 0, 999)
    assert (await missing.end(COMMIT)).error == pb.TransactionNotFound
    assert (await Txn(client, 1 << 63, 1).end(COMMIT)).error == pb.TransactionNotFound


async def test_an_expired_transaction_cannot_commit(client: WireClient) -> None:
    txn = await new_txn(client, ttl_ms=100)
    await asyncio.sleep(0.6)
    assert (await txn.end(COMMIT)).error == pb.InvalidTxnStatus


async def test_an_aborted_transaction_takes_no_partition_and_no_send(client: WireClient) -> None:
    await client.create_producer(TOPIC)
    txn = await new_txn(client)
    await txn.end(ABORT)
    reply = await txn.request("ADD_PARTITION_TO_TXN", partitions=[TOPIC])
    assert isinstance(reply, pb.CommandAddPartitionToTxnResponse)
    assert reply.error == pb.InvalidTxnStatus
    reply = await client.publish(0, 0, b"too late", **txn.bits)
    assert reply.type == BaseCommand.SEND_ERROR
    assert reply.send_error.error == pb.InvalidTxnStatus


async def test_committed_messages_appear_only_after_the_commit(server: ProtocolServer, client: WireClient,
                                                               connect: Connect) -> None:
    watcher = await connect(server.port)
    await watcher.subscribe(TOPIC, "watch", permits=100)
    await client.create_producer(TOPIC)
    txn = await new_txn(client)
    added = await txn.request("ADD_PARTITION_TO_TXN", partitions=["txn"])        # short names normalised
    assert not added.HasField("error")
    meta = metadata(sequence_id=0, txnid_most_bits=0, txnid_least_bits=txn.bits["txnid_least_bits"])
    client.send_payload("SEND", meta, b"in txn", producer_id=0, sequence_id=0, **txn.bits)
    receipt = await client.expect("SEND_RECEIPT")
    assert receipt.sequence_id == 0
    plain = await client.publish(0, 1, b"after the open txn")
    assert plain.type == BaseCommand.SEND_RECEIPT
    await watcher.no_command(0.3)                      # held back by the open transaction
    assert not (await txn.end(COMMIT)).HasField("error")
    assert [(await watcher.message())[1] for _ in range(2)] == [b"in txn", b"after the open txn"]


async def test_aborted_messages_never_appear(server: ProtocolServer, client: WireClient, connect: Connect) -> None:
    watcher = await connect(server.port)
    await watcher.subscribe(TOPIC, "watch", permits=100)
    await client.create_producer(TOPIC)
    txn = await new_txn(client)
    # No ADD_PARTITION_TO_TXN first: the broker registers the partition itself.
    assert (await client.publish(0, 0, b"aborted", **txn.bits)).type == BaseCommand.SEND_RECEIPT
    await txn.end(ABORT)
    assert (await client.publish(0, 1, b"plain")).type == BaseCommand.SEND_RECEIPT
    assert (await watcher.message())[1] == b"plain"
    await watcher.no_command()


async def test_transactional_acks_are_answered_and_conflicts_reported(client: WireClient) -> None:
    await client.create_producer(TOPIC)
    receipts = [(await client.publish(0, i, b"m%d" % i)).send_receipt for i in range(2)]
    await client.subscribe(TOPIC, "s", sub_type=pb.CommandSubscribe.Shared, permits=10)
    await client.message(), await client.message()
    first = {"ledgerId": receipts[0].message_id.ledgerId, "entryId": receipts[0].message_id.entryId}
    second = {"ledgerId": receipts[1].message_id.ledgerId, "entryId": receipts[1].message_id.entryId}
    txn_a, txn_b = await new_txn(client), await new_txn(client)
    added = await txn_a.request("ADD_SUBSCRIPTION_TO_TXN", subscription=[{"topic": TOPIC, "subscription": "s"}])
    assert isinstance(added, pb.CommandAddSubscriptionToTxnResponse) and not added.HasField("error")
    reply = await txn_a.request("ACK", consumer_id=0, ack_type=pb.CommandAck.Individual, message_id=[first])
    assert isinstance(reply, pb.CommandAckResponse) and not reply.HasField("error")
    assert (reply.txnid_most_bits, reply.txnid_least_bits) == (0, txn_a.bits["txnid_least_bits"])
    # Pending in A: B conflicts.
    reply = await txn_b.request("ACK", consumer_id=0, ack_type=pb.CommandAck.Individual, message_id=[first])
    assert reply.error == pb.TransactionConflict
    # Already acknowledged: a transaction conflicts too.
    await client.request("ACK", consumer_id=0, ack_type=pb.CommandAck.Individual, message_id=[second],
                         request_id=_next_id())
    reply = await txn_b.request("ACK", consumer_id=0, ack_type=pb.CommandAck.Individual, message_id=[second])
    assert reply.error == pb.TransactionConflict
    # After A commits, the message stays acknowledged.
    assert not (await txn_a.end(COMMIT)).HasField("error")
    client.send("REDELIVER_UNACKNOWLEDGED_MESSAGES", consumer_id=0)
    await client.no_command()


async def test_an_aborted_transactional_ack_gives_the_message_back(client: WireClient) -> None:
    await client.create_producer(TOPIC)
    receipt = (await client.publish(0, 0, b"m0")).send_receipt
    await client.subscribe(TOPIC, "s", permits=10)
    await client.message()
    txn = await new_txn(client)
    position = {"ledgerId": receipt.message_id.ledgerId, "entryId": receipt.message_id.entryId}
    reply = await txn.request("ACK", consumer_id=0, ack_type=pb.CommandAck.Cumulative, message_id=[position])
    assert not reply.HasField("error")
    # The abort puts the message back at once (before or after END_TXN's answer).
    client.send("END_TXN", request_id=_next_id(), txn_action=int(ABORT), **txn.bits)
    replies = {BaseCommand.Type.Name(cmd.type): cmd for cmd in [await client.receive(), await client.receive()]}
    assert not replies["END_TXN_RESPONSE"].endTxnResponse.HasField("error")
    assert replies["MESSAGE"].message.message_id == pb.MessageIdData(**position)


async def test_transactional_acks_on_unknown_consumers_and_bad_txns(client: WireClient) -> None:
    reply = await client.request("ACK", consumer_id=8, ack_type=pb.CommandAck.Individual,
                                 message_id=[{"ledgerId": 1, "entryId": 0}], txnid_most_bits=0,
                                 txnid_least_bits=0)
    assert reply.error == pb.ConsumerNotFound
    await client.subscribe(TOPIC, "s")
    reply = await client.request("ACK", consumer_id=0, ack_type=pb.CommandAck.Individual,
                                 message_id=[{"ledgerId": 1, "entryId": 0}], txnid_most_bits=0,
                                 txnid_least_bits=12345, request_id=3)
    assert (reply.request_id, reply.error) == (3, pb.TransactionNotFound)


@pytest.mark.parametrize("command", ["ADD_PARTITION_TO_TXN", "ADD_SUBSCRIPTION_TO_TXN"])
async def test_adding_to_an_unknown_transaction(client: WireClient, command: str) -> None:
    reply = await Txn(client, 2, 4242).request(command)
    assert reply.error == pb.TransactionNotFound


@pytest.mark.parametrize("command, response", [
    ("END_TXN_ON_PARTITION", pb.CommandEndTxnOnPartitionResponse),
    ("END_TXN_ON_SUBSCRIPTION", pb.CommandEndTxnOnSubscriptionResponse),
])
async def test_broker_to_broker_commands_are_refused(client: WireClient, command: str, response: type) -> None:
    reply = await Txn(client, 0, 0).request(command)
    assert isinstance(reply, response)
    assert reply.error == pb.NotAllowedError


async def test_a_connection_without_transaction_requests_gets_no_transaction_response(
        server: ProtocolServer, client: WireClient, connect: Connect) -> None:
    observer = await connect(server.port)
    await observer.subscribe(TOPIC, "observe", permits=10)
    await client.create_producer(TOPIC)
    txn = await new_txn(client)
    await client.publish(0, 0, b"x", **txn.bits)
    await txn.end(COMMIT)
    message, _ = await observer.message()
    assert message.consumer_id == 0
    await observer.no_command()


async def test_add_partition_is_answered_before_its_record_is_durable(service, server: ProtocolServer,
                                                                     client: WireClient, connect: Connect) -> None:
    """v4 answers ADD_PARTITION_TO_TXN once its record is queued: the SEND that follows is
    written with it or after it, so a txn's first send waits for one group commit, not two."""
    watcher = await connect(server.port)
    await watcher.subscribe(TOPIC, "watch", permits=100)
    await client.create_producer(TOPIC)
    txn = await new_txn(client)
    gate = GatedWriter(service.env)
    try:
        added = await txn.request("ADD_PARTITION_TO_TXN", partitions=[TOPIC])    # nothing can be written
        assert not added.HasField("error")
        await gate.next_commit()                      # the registration's group commit, held
        meta = metadata(sequence_id=0, txnid_most_bits=0, txnid_least_bits=txn.bits["txnid_least_bits"])
        client.send_payload("SEND", meta, b"in txn", producer_id=0, sequence_id=0, **txn.bits)
        await client.no_command(0.3)                  # not stored before its registration is
    finally:
        gate.open()
    assert (await client.expect("SEND_RECEIPT")).sequence_id == 0
    assert not (await txn.end(COMMIT)).HasField("error")
    assert (await watcher.message())[1] == b"in txn"


@pytest.mark.parametrize("first_txn", [True, False], ids=["first-txn-of-the-topic", "transactional-topic"])
async def test_a_send_after_a_registration_that_failed_stores_nothing(service, server: ProtocolServer,
                                                                      client: WireClient, connect: Connect,
                                                                      first_txn: bool) -> None:
    """The early answer's other half: the registration's write fails after the client was
    told it succeeded; the send queued behind it fails with it instead of leaving a message
    that the coordinator would never end (its partition unknown after the undo). The send
    waits in the buffer while the topic is first marked transactional; after that it goes to
    the ledger at once, conditional on the registration's write."""
    watcher = await connect(server.port)
    await watcher.subscribe(TOPIC, "watch", permits=100)
    await client.create_producer(TOPIC)
    if not first_txn:
        earlier = await new_txn(client)
        assert (await client.publish(0, 100, b"aborted", **earlier.bits)).type == BaseCommand.SEND_RECEIPT
        assert not (await earlier.end(ABORT)).HasField("error")
    txn = await new_txn(client)
    least = txn.bits["txnid_least_bits"]
    gate = GatedWriter(service.env)
    try:
        assert not (await txn.request("ADD_PARTITION_TO_TXN", partitions=[TOPIC])).HasField("error")
        await gate.next_commit()                      # held: the send goes to the next commit
        meta = metadata(sequence_id=0, txnid_most_bits=0, txnid_least_bits=least)
        client.send_payload("SEND", meta, b"lost", producer_id=0, sequence_id=0, **txn.bits)
        await client.no_command(0.3)
        gate.let_through(OSError(5, "injected I/O error"))      # the registration's commit fails
    finally:
        gate.open()
    error = await client.expect("SEND_ERROR")
    assert (error.sequence_id, error.error) == (0, pb.PersistenceError) and "not written" in error.message
    topic = service.topics[TOPIC]
    stored = topic.ledger.read_entries(topic.ledger.first_position(), 10)
    assert [e for e in stored if e.txn == TxnId(0, least)] == []
    assert TxnId(0, least) not in {t for t, _ in topic.buffer.ongoing_txns()}
    assert service.coordinator.get(TxnId(0, least)).partitions == []
    # The txn goes on: its next send registers the partition again.
    again = metadata(sequence_id=101, txnid_most_bits=0, txnid_least_bits=least)
    client.send_payload("SEND", again, b"again", producer_id=0, sequence_id=101, **txn.bits)
    assert (await client.expect("SEND_RECEIPT")).sequence_id == 101
    assert not (await txn.end(COMMIT)).HasField("error")
    assert (await watcher.message())[1] == b"again"
    await watcher.no_command()


async def _one_received_message(client: WireClient) -> dict[str, int]:
    receipt = (await client.publish(0, 0, b"m")).send_receipt
    await client.subscribe(TOPIC, "s", sub_type=pb.CommandSubscribe.Shared, permits=10)
    await client.message()
    return {"ledgerId": receipt.message_id.ledgerId, "entryId": receipt.message_id.entryId}


async def test_add_subscription_is_answered_before_its_record_is_durable(service, client: WireClient) -> None:
    await client.create_producer(TOPIC)
    message = await _one_received_message(client)
    txn = await new_txn(client)
    gate = GatedWriter(service.env)
    try:
        added = await txn.request("ADD_SUBSCRIPTION_TO_TXN", subscription=[{"topic": TOPIC, "subscription": "s"}])
        assert not added.HasField("error")                 # answered while nothing can be written
        await gate.next_commit()
        ack = asyncio.ensure_future(txn.request("ACK", consumer_id=0, ack_type=pb.CommandAck.Individual,
                                                message_id=[message]))
        await asyncio.sleep(0.2)
        assert not ack.done()                              # its record is not durable yet
    finally:
        gate.open()
    assert not (await ack).HasField("error")
    assert not (await txn.end(COMMIT)).HasField("error")
    subscription = service.topics[TOPIC].subscriptions["s"]
    assert subscription.cursor.is_acked(Position(message["ledgerId"], message["entryId"]))


async def test_an_ack_after_a_registration_that_failed_is_not_recorded(service, client: WireClient) -> None:
    await client.create_producer(TOPIC)
    message = await _one_received_message(client)
    txn, other = await new_txn(client), await new_txn(client)
    gate = GatedWriter(service.env)
    try:
        added = await txn.request("ADD_SUBSCRIPTION_TO_TXN", subscription=[{"topic": TOPIC, "subscription": "s"}])
        assert not added.HasField("error")
        await gate.next_commit()                           # held: the ack's record goes to the next commit
        ack = asyncio.ensure_future(txn.request("ACK", consumer_id=0, ack_type=pb.CommandAck.Individual,
                                                message_id=[message]))
        await asyncio.sleep(0.2)
        gate.let_through(OSError(5, "injected I/O error"))   # the registration's commit fails
    finally:
        gate.open()
    reply = await ack
    assert reply.error == pb.PersistenceError
    # Nothing of it is left: the message is free for another transaction.
    assert service.coordinator.get(TxnId(0, txn.bits["txnid_least_bits"])).subscriptions == []
    reply = await other.request("ACK", consumer_id=0, ack_type=pb.CommandAck.Individual, message_id=[message])
    assert not reply.HasField("error")
    assert not (await other.end(COMMIT)).HasField("error")


def _responses(frames: list[bytes]) -> list[pb.BaseCommand]:
    return [pb.BaseCommand.FromString(f[8:8 + int.from_bytes(f[4:8], "big")]) for f in frames]


async def test_v4_registrations_are_answered_in_the_turn_their_frame_arrives(service) -> None:
    """ADD_PARTITION_TO_TXN / ADD_SUBSCRIPTION_TO_TXN of a v4 txn need no task: the answer is
    written while the frame is handled (the client's sends wait for it); refusals too."""
    written: list[bytes] = []
    commands = TransactionCommands(SimpleNamespace(service=service, write=written.append))
    txn = await service.coordinator.new_transaction(0, 60_000)
    halves = {"txnid_most_bits": txn.most_bits, "txnid_least_bits": txn.least_bits}
    assert commands.add_partition_to_txn(pb.CommandAddPartitionToTxn(request_id=7, partitions=[TOPIC], **halves)) is None
    assert commands.add_subscription_to_txn(pb.CommandAddSubscriptionToTxn(
        request_id=8, subscription=[pb.Subscription(topic=TOPIC, subscription="s")], **halves)) is None
    unknown = {"txnid_most_bits": 0, "txnid_least_bits": 1 << 40}
    assert commands.add_partition_to_txn(pb.CommandAddPartitionToTxn(request_id=9, partitions=[TOPIC],
                                                                     **unknown)) is None
    added, subscribed, refused = _responses(written)
    assert (added.type, added.addPartitionToTxnResponse.request_id) == (BaseCommand.ADD_PARTITION_TO_TXN_RESPONSE, 7)
    assert not added.addPartitionToTxnResponse.HasField("error")
    assert subscribed.addSubscriptionToTxnResponse.request_id == 8
    assert not subscribed.addSubscriptionToTxnResponse.HasField("error")
    assert refused.addPartitionToTxnResponse.error == pb.TransactionNotFound
    await asyncio.sleep(0.05)                         # the registrations' records are written
    assert service.coordinator.get(txn).partitions == [TOPIC]
    assert service.coordinator.get(txn).subscriptions == [(TOPIC, "s")]


async def test_sends_after_a_durable_registration_register_nothing_and_stop_with_the_txn(
        service, client: WireClient, monkeypatch) -> None:
    """A txn's later sends to a partition whose registration is durable skip registering it
    again (nothing to wait for, no condition); once the txn ended they are refused as before."""
    await client.create_producer(TOPIC)
    txn = await new_txn(client)
    assert not (await txn.request("ADD_PARTITION_TO_TXN", partitions=[TOPIC])).HasField("error")
    registrations = []
    register = service.coordinator.register_produced_partitions
    monkeypatch.setattr(service.coordinator, "register_produced_partitions",
                        lambda txn_id, partitions: registrations.append(partitions) or register(txn_id, partitions))
    await service.env.barrier()                       # the registration is durable
    least = txn.bits["txnid_least_bits"]
    for sequence_id in range(3):
        meta = metadata(sequence_id=sequence_id, txnid_most_bits=0, txnid_least_bits=least)
        client.send_payload("SEND", meta, b"in txn", producer_id=0, sequence_id=sequence_id, **txn.bits)
        assert (await client.expect("SEND_RECEIPT")).sequence_id == sequence_id
    assert registrations == []
    assert not (await txn.end(ABORT)).HasField("error")
    reply = await client.publish(0, 3, b"too late", **txn.bits)
    assert reply.type == BaseCommand.SEND_ERROR and reply.send_error.error == pb.InvalidTxnStatus
    assert registrations == [[TOPIC]]                 # the ended txn went the checking way
