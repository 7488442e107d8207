"""A batch-index ACK on the wire names the batch's size (MessageIdData.batch_size, sent by our
client and by the Java client in a transaction) and an ack set built for that size. The broker
knows the entry's number of messages (recorded when it dispatched the entry, else stored with
it): a size that disagrees, or an ack of a position that holds no entry, is refused.

Taken as it came, the size was either silently replaced by the entry's (an ack set built for a
batch of 3 then acknowledged indexes 3.. of a batch of 10: their bits are clear), or, for a
position that holds no entry, bounded only by the ack set's bits: a transaction's cumulative ack
of such a position with a few hundred KB of ack set made the broker list millions of indexes.

Pulsar's broker takes the batch size of a plain ack from the consumer's pending acks (its
dispatch), never from the client, and that of a transactional ack from the client unchecked;
ours checks the client's against the entry. The good acks of a plain ACK are kept, and the
client that asked for a receipt is answered with an error; a transactional ACK is refused whole
(as its pending acks refuse a request in conflict) with an error."""

from __future__ import annotations

import asyncio
import time
import tracemalloc
from collections.abc import AsyncIterator
from typing import Any

import pytest

from pyengine.broker.service import BrokerConfig, BrokerService
from pyengine.client.message import unacked_from
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.storage import ManagedLedgerConfig
from pyengine.transaction import TxnAction
from tests.protocol.conftest import NUM_COORDINATORS
from tests.protocol.test_server_consume import batch_of
from tests.protocol.test_server_transactions import _next_id, new_txn
from tests.protocol.wire_driver import BaseCommand, WireClient, metadata
from tests.transaction.pendingack.helpers import acking

TOPIC = "persistent://public/default/ack-batch-size"
COMMIT = TxnAction.COMMIT
HUGE = 300_000_000                   # below the kernels' bound ((2**31 - 1) // 6), far above 10
Sub = pb.CommandSubscribe


@pytest.fixture
async def service(tmp_path) -> AsyncIterator[BrokerService]:
    """One entry per ledger: the position after a ledger's only entry holds none, yet is
    before the topic's last entry (an ack there is not refused as one past the end)."""
    service = BrokerService(BrokerConfig(data_dir=tmp_path, sync=False, num_coordinators=NUM_COORDINATORS,
                                         ledger=ManagedLedgerConfig(max_entries_per_ledger=1)))
    await service.start()
    yield service
    await service.close()


async def batch_and_single(client: WireClient, sub_type: int = Sub.Shared) -> tuple[dict, dict]:
    """A batch of 10 messages and a message alone, both delivered to consumer 0."""
    await client.create_producer(TOPIC, producer_id=1)
    client.send_payload("SEND", metadata(sequence_id=0, num_messages_in_batch=10), batch_of(10), producer_id=1,
                        sequence_id=0, num_messages=10)
    batch = (await client.expect("SEND_RECEIPT")).message_id
    single = (await client.publish(1, 10, b"alone")).send_receipt.message_id
    await client.subscribe(TOPIC, "s", sub_type=sub_type, permits=100)
    got = [(await client.message())[0].message_id for _ in range(2)]
    assert [(m.ledgerId, m.entryId) for m in got] == [(batch.ledgerId, batch.entryId),
                                                     (single.ledgerId, single.entryId)]
    return ({"ledgerId": batch.ledgerId, "entryId": batch.entryId},
            {"ledgerId": single.ledgerId, "entryId": single.entryId})


def batch_ack(position: dict, ack_set: list[int], batch_size: int) -> dict[str, Any]:
    return {**position, "ack_set": ack_set, "batch_size": batch_size}


def at(position: dict) -> tuple[int, int]:
    return position["ledgerId"], position["entryId"]


async def redelivered(client: WireClient) -> list[tuple[tuple[int, int], list[int]]]:
    """Ask for everything unacknowledged again: (position, ack set) of what comes, by position."""
    client.send("REDELIVER_UNACKNOWLEDGED_MESSAGES", consumer_id=0)
    out = []
    while True:
        try:
            cmd = await client.receive(0.5)
        except TimeoutError:
            return sorted(out)
        assert cmd.type == BaseCommand.MESSAGE, cmd
        message_id = cmd.message.message_id
        out.append(((message_id.ledgerId, message_id.entryId), list(cmd.message.ack_set)))


async def ack(client: WireClient, *message_ids: dict, ack_type: int = pb.CommandAck.Individual,
              **fields: Any) -> Any:
    """An ACK asking for a receipt: its answer, which comes at once."""
    started = time.monotonic()
    reply = await client.request("ACK", consumer_id=0, ack_type=ack_type, message_id=list(message_ids),
                                 request_id=_next_id(), **fields)
    assert time.monotonic() - started < 2
    assert isinstance(reply, pb.CommandAckResponse), reply
    return reply


@pytest.mark.parametrize("claimed", [HUGE, 3, 11, -1])
async def test_a_batch_size_the_entry_does_not_have_is_refused_and_the_other_acks_kept(client: WireClient,
                                                                                    claimed: int) -> None:
    batch, single = await batch_and_single(client)
    # Index 1 acknowledged, in an ack set built for the size claimed (for 3: bits 0 and 2 set,
    # so indexes 3..9 of the real batch looked acknowledged too).
    ack_set = acking(3, 1) if claimed == 3 else acking(10, 1)
    reply = await ack(client, batch_ack(batch, ack_set, claimed), single)
    assert reply.error == pb.NotAllowedError
    assert "holds 10 messages" in reply.message
    # The message alone was acknowledged; no index of the batch was.
    assert await redelivered(client) == [(at(batch), [])]
    # The right size is taken.
    assert not (await ack(client, batch_ack(batch, acking(10, 1), 10))).HasField("error")
    assert await redelivered(client) == [(at(batch), acking(10, 1))]


async def test_without_a_receipt_the_refused_ack_is_dropped_and_the_rest_taken(client: WireClient) -> None:
    batch, single = await batch_and_single(client)
    client.send("ACK", consumer_id=0, ack_type=pb.CommandAck.Individual,
                message_id=[batch_ack(batch, acking(3, 0, 1), 3), single])
    await client.no_command()
    assert await redelivered(client) == [(at(batch), [])]
    # The connection goes on.
    assert not (await ack(client, batch_ack(batch, acking(10, 0, 1), 10))).HasField("error")
    assert await redelivered(client) == [(at(batch), acking(10, 0, 1))]


async def test_an_ack_without_a_batch_size_is_sized_by_the_entry(client: WireClient) -> None:
    """The Java client's plain acks name no batch size: the entry's is taken (as Pulsar)."""
    batch, _ = await batch_and_single(client)
    assert not (await ack(client, {**batch, "ack_set": acking(10, 4)})).HasField("error")
    assert (at(batch), acking(10, 4)) in await redelivered(client)


async def test_a_batch_ack_of_a_position_that_holds_no_entry_is_refused(client: WireClient) -> None:
    batch, single = await batch_and_single(client)
    nothing = {"ledgerId": batch["ledgerId"], "entryId": batch["entryId"] + 5}
    reply = await ack(client, batch_ack(nothing, acking(64, 3), 64), single)
    assert reply.error == pb.NotAllowedError and "holds no entry" in reply.message
    assert await redelivered(client) == [(at(batch), [])]


@pytest.mark.parametrize("claimed", [HUGE, 3])
async def test_a_transactional_ack_with_a_wrong_batch_size_is_refused_whole(client: WireClient,
                                                                           claimed: int) -> None:
    batch, single = await batch_and_single(client)
    txn = await new_txn(client)
    ack_set = acking(3, 1) if claimed == 3 else acking(10, 1)
    reply = await ack(client, single, batch_ack(batch, ack_set, claimed), **txn.bits)
    assert reply.error == pb.NotAllowedError and "holds 10 messages" in reply.message
    # Nothing of the request was reserved: the commit acknowledges nothing.
    assert not (await txn.end(COMMIT)).HasField("error")
    assert await redelivered(client) == sorted([(at(batch), []), (at(single), [])])


async def test_a_transactional_ack_with_the_right_batch_size_is_taken(client: WireClient) -> None:
    batch, single = await batch_and_single(client)
    txn = await new_txn(client)
    assert not (await ack(client, single, batch_ack(batch, acking(10, 1), 10), **txn.bits)).HasField("error")
    assert not (await txn.end(COMMIT)).HasField("error")
    assert await redelivered(client) == [(at(batch), acking(10, 1))]


@pytest.mark.parametrize("claimed", [HUGE, 4])
async def test_a_transactional_cumulative_ack_inside_a_batch_with_a_wrong_size_is_refused(
        client: WireClient, claimed: int) -> None:
    batch, _ = await batch_and_single(client, Sub.Exclusive)
    txn = await new_txn(client)
    # Up to index 1: the indexes after it left unacknowledged (as the Java client sends it).
    reply = await ack(client, batch_ack(batch, unacked_from(2, min(claimed, 10)), claimed), **txn.bits,
                      ack_type=pb.CommandAck.Cumulative)
    assert reply.error == pb.NotAllowedError
    assert not (await txn.end(COMMIT)).HasField("error")
    assert (await redelivered(client))[0] == (at(batch), [])


async def test_a_huge_batch_size_for_a_position_without_entry_takes_no_memory(client: WireClient) -> None:
    """A transaction's cumulative ack of a position that holds no entry, its ack set of 62,500
    words (all acknowledged but the last): sized by those bits, the broker listed 4 million
    acknowledged indexes (a few hundred KB more of ack set: billions of bytes)."""
    batch, _ = await batch_and_single(client, Sub.Exclusive)
    nothing = {"ledgerId": batch["ledgerId"], "entryId": batch["entryId"] + 5}
    words = [0] * 62_499 + [-1]
    txn = await new_txn(client)
    tracemalloc.start()
    try:
        reply = await ack(client, batch_ack(nothing, words, HUGE), **txn.bits, ack_type=pb.CommandAck.Cumulative)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert reply.error == pb.NotAllowedError and "holds no entry" in reply.message
    assert peak < 20 << 20, f"{peak / 2**20:.0f} MiB for one ACK"
    assert not (await txn.end(COMMIT)).HasField("error")
    # The broker is fine.
    await asyncio.sleep(0)
    assert not (await ack(client, batch_ack(batch, unacked_from(2, 10), 10),
                          ack_type=pb.CommandAck.Cumulative)).HasField("error")


@pytest.mark.parametrize("sent", [3, 1, 25])
async def test_the_entry_is_sized_by_its_metadata_not_by_the_send_command(client: WireClient, sent: int) -> None:
    """CommandSend.num_messages may disagree with the metadata's num_messages_in_batch, which
    consumers split the batch by: the entry holds what the metadata says (as Apache's dispatchers
    read it), so the consumer's batch-index acks of it are taken."""
    await client.create_producer(TOPIC, producer_id=1)
    client.send_payload("SEND", metadata(sequence_id=0, num_messages_in_batch=10), batch_of(10), producer_id=1,
                        sequence_id=0, num_messages=sent)
    receipt = (await client.expect("SEND_RECEIPT"))
    assert receipt.sequence_id == 0
    batch = {"ledgerId": receipt.message_id.ledgerId, "entryId": receipt.message_id.entryId}
    await client.subscribe(TOPIC, "s", sub_type=Sub.Shared, permits=100)
    assert (await client.message())[0].message_id.entryId == batch["entryId"]
    assert not (await ack(client, batch_ack(batch, acking(10, 1, 7), 10))).HasField("error")
    assert await redelivered(client) == [(at(batch), acking(10, 1, 7))]
    if sent > 1:        # the size the SEND named is not the entry's
        assert (await ack(client, batch_ack(batch, acking(sent, 0), sent))).error == pb.NotAllowedError
