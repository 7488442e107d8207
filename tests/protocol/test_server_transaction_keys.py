"""Transaction keys on the wire: TC_CLIENT_CONNECT with `transaction_key` and `epoch`, fencing
of the older epoch's connection and requests, the ExpiredTransaction error on send, ack and
END_TXN, malformed keys, and the unkeyed connect unchanged."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.server import ProtocolServer
from pyengine.transaction import TxnAction
from pyengine.transaction.coordinator.keys import ANONYMOUS, coordinator_for
from tests.protocol.conftest import NUM_COORDINATORS
from tests.protocol.wire_driver import BaseCommand, WireClient, metadata

Connect = Callable[..., Awaitable[WireClient]]
TOPIC = "persistent://public/default/keyed"
KEY = "task-7"
TC = coordinator_for(ANONYMOUS, KEY, NUM_COORDINATORS)
_ids = iter(range(1, 1 << 30))


async def key_connect(client: WireClient, key: str = KEY, epoch: int | None = -1, tc_id: int | None = None):
    fields = {"transaction_key": key} if key is not None else {}
    if epoch is not None:
        fields["epoch"] = epoch
    reply = await client.request("TC_CLIENT_CONNECT_REQUEST", request_id=next(_ids),
                                 tc_id=TC if tc_id is None else tc_id, **fields)
    assert isinstance(reply, pb.CommandTcClientConnectResponse)
    return reply


async def new_txn(client: WireClient) -> pb.CommandNewTxnResponse:
    return await client.request("NEW_TXN", request_id=next(_ids), tc_id=TC, txn_ttl_seconds=60_000)


def bits(reply) -> dict[str, int]:
    return {"txnid_most_bits": reply.txnid_most_bits, "txnid_least_bits": reply.txnid_least_bits}


async def test_each_connect_gets_the_next_epoch_and_closes_the_previous_holder(server: ProtocolServer,
                                                                                connect: Connect) -> None:
    first, second = await connect(server.port), await connect(server.port)
    reply = await key_connect(first)
    assert (reply.HasField("error"), reply.epoch) == (False, 0)
    assert (await key_connect(second)).epoch == 1
    assert await first.closed()                        # the fenced epoch's connection
    third = await connect(server.port)
    refused = await key_connect(third, epoch=0)        # the zombie, reconnecting
    assert refused.error == pb.NotAllowedError and "fenced" in refused.message
    assert not refused.HasField("epoch")
    again = await key_connect(second, epoch=1)         # the holder reconnects on its connection
    assert again.epoch == 2 and await second.no_command(0.1) is None


async def test_fencing_expires_send_ack_and_end_txn_of_the_old_epoch(server: ProtocolServer, connect: Connect) -> None:
    zombie, task2, watcher = [await connect(server.port) for _ in range(3)]
    await key_connect(zombie)
    txn = bits(await new_txn(zombie))
    await zombie.create_producer(TOPIC, producer_id=1, request_id=next(_ids))
    assert (await zombie.publish(1, 0, b"in-txn", **txn)).type == BaseCommand.SEND_RECEIPT
    await watcher.create_producer(TOPIC, producer_id=1, request_id=next(_ids))
    assert (await watcher.publish(1, 0, b"plain", producer_name="w")).type == BaseCommand.SEND_RECEIPT
    await watcher.subscribe(TOPIC, "watch", consumer_id=2, request_id=next(_ids), permits=10)
    await watcher.no_command(0.2)                       # "plain" waits behind the open txn

    assert (await key_connect(task2)).epoch == 1       # the fence: txn aborted at once
    _, payload = await watcher.message(timeout=1)
    assert payload.endswith(b"plain")
    assert await zombie.closed()

    # Every request of the fenced txn, over any connection, is refused as expired.
    await task2.create_producer(TOPIC, producer_id=3, request_id=next(_ids))
    late = await task2.publish(3, 0, b"late", producer_name="z", **txn)
    assert late.type == BaseCommand.SEND_ERROR and late.send_error.error == pb.ExpiredTransaction
    await task2.subscribe(TOPIC, "sub", consumer_id=4, request_id=next(_ids))
    ack = await task2.request("ACK", consumer_id=4, ack_type=pb.CommandAck.Cumulative, request_id=next(_ids),
                              message_id=[pb.MessageIdData(ledgerId=0, entryId=0)], **txn)
    assert ack.error == pb.ExpiredTransaction
    for action in (TxnAction.COMMIT, TxnAction.ABORT):
        end = await task2.request("END_TXN", request_id=next(_ids), txn_action=int(action), **txn)
        assert end.error == pb.ExpiredTransaction and "epoch 0" in end.message
    added = await task2.request("ADD_PARTITION_TO_TXN", request_id=next(_ids), partitions=[TOPIC], **txn)
    assert added.error == pb.ExpiredTransaction
    assert (await new_txn(task2)).HasField("error") is False   # the new epoch works


async def test_one_open_transaction_per_key_on_the_wire(server: ProtocolServer, client: WireClient) -> None:
    await key_connect(client)
    first = await new_txn(client)
    assert not first.HasField("error")
    second = await new_txn(client)
    assert second.error == pb.NotAllowedError and "open transaction" in second.message
    end = await client.request("END_TXN", request_id=next(_ids), txn_action=int(TxnAction.COMMIT), **bits(first))
    assert not end.HasField("error")
    assert not (await new_txn(client)).HasField("error")


@pytest.mark.parametrize("key", ["", "k" * 257, "owner&key"])
async def test_malformed_keys_are_refused(server: ProtocolServer, client: WireClient, key: str) -> None:
    reply = await key_connect(client, key=key, tc_id=0)
    assert reply.error == pb.NotAllowedError and "transaction key" in reply.message
    assert not reply.HasField("epoch")
    assert (await key_connect(client)).epoch == 0      # the connection keeps working


async def test_a_key_on_the_wrong_coordinator_or_an_unknown_epoch_is_refused(server: ProtocolServer,
                                                                             client: WireClient) -> None:
    wrong = await key_connect(client, tc_id=(TC + 1) % NUM_COORDINATORS)
    assert wrong.error == pb.NotAllowedError and f"coordinator {TC}" in wrong.message
    unknown = await key_connect(client, tc_id=NUM_COORDINATORS + 3)
    assert unknown.error == pb.TransactionCoordinatorNotFound
    future = await key_connect(client, epoch=5)         # never handed out
    assert future.error == pb.NotAllowedError
    for odd in (-5, -(2**63), 2**63 - 1):              # not an epoch a client can hold
        assert (await key_connect(client, epoch=odd)).error == pb.NotAllowedError
    assert (await key_connect(client, epoch=None)).epoch == 0   # no epoch field: a new task


async def test_the_unkeyed_connect_is_unchanged(server: ProtocolServer, client: WireClient) -> None:
    reply = await key_connect(client, key=None, epoch=None, tc_id=0)
    assert not reply.HasField("error") and not reply.HasField("epoch")
    # an epoch without a key is ignored, as an older broker ignores unknown fields
    reply = await key_connect(client, key=None, epoch=3, tc_id=0)
    assert not reply.HasField("error") and not reply.HasField("epoch")
    first = await client.request("NEW_TXN", request_id=next(_ids), tc_id=0, txn_ttl_seconds=1000)
    second = await client.request("NEW_TXN", request_id=next(_ids), tc_id=0, txn_ttl_seconds=1000)
    assert not first.HasField("error") and not second.HasField("error")   # no one-txn limit


async def test_a_send_before_the_fence_is_aborted_with_the_txn(server: ProtocolServer, connect: Connect) -> None:
    zombie, task2 = await connect(server.port), await connect(server.port)
    await key_connect(zombie)
    txn = bits(await new_txn(zombie))
    await zombie.create_producer(TOPIC, producer_id=1, request_id=next(_ids))
    await zombie.publish(1, 0, b"never-visible", **txn)
    await key_connect(task2)
    await task2.subscribe(TOPIC, "all", consumer_id=1, request_id=next(_ids), permits=10)
    await task2.create_producer(TOPIC, producer_id=2, request_id=next(_ids))
    meta = metadata("t2", 0)
    task2.send_payload("SEND", meta, b"visible", producer_id=2, sequence_id=0)
    seen = []
    while len(seen) < 1:
        cmd, raw = await task2.receive_command()
        if cmd.type == BaseCommand.MESSAGE:
            seen.append(raw.payload)
    assert seen[0].endswith(b"visible")
    await task2.no_command(0.2)


async def test_a_late_send_of_an_ended_transaction_never_lands_in_the_next_one(server: ProtocolServer,
                                                                               connect: Connect) -> None:
    """Kafka KIP-890 / Jepsen's Bufstream finding: a delayed or retried produce of an ended
    transaction must not join the key's next transaction (ids are per transaction here)."""
    task, watcher = await connect(server.port), await connect(server.port)
    await key_connect(task)
    first = bits(await new_txn(task))
    await task.create_producer(TOPIC, producer_id=1, request_id=next(_ids))
    assert (await task.publish(1, 0, b"first", **first)).type == BaseCommand.SEND_RECEIPT
    end = await task.request("END_TXN", request_id=next(_ids), txn_action=int(TxnAction.COMMIT), **first)
    assert not end.HasField("error")
    second = bits(await new_txn(task))
    late = await task.publish(1, 1, b"late-retry-of-first", **first)
    assert late.type == BaseCommand.SEND_ERROR
    assert late.send_error.error in (pb.InvalidTxnStatus, pb.TransactionNotFound)
    assert (await task.publish(1, 2, b"second", **second)).type == BaseCommand.SEND_RECEIPT
    end = await task.request("END_TXN", request_id=next(_ids), txn_action=int(TxnAction.COMMIT), **second)
    assert not end.HasField("error")
    await watcher.subscribe(TOPIC, "all", consumer_id=1, request_id=next(_ids), permits=10)
    seen = [(await watcher.message())[1] for _ in range(2)]
    assert seen[0].endswith(b"first") and seen[1].endswith(b"second")
    assert not any(b"late-retry" in payload for payload in seen)
    await watcher.no_command(0.2)


async def test_a_connect_is_answered_while_a_participant_never_confirms_the_fenced_abort(
        server: ProtocolServer, service, connect: Connect) -> None:
    """The fence answers once the zombie's abort is durably decided; a participant that does not
    confirm it (unreachable, slow) is told in the background, not waited for without bound."""
    service.coordinator_v4.keys.fence_wait_ms = 100
    release, told = asyncio.Event(), []
    real = service.end_txn_on_subscription

    async def unreachable(topic, subscription, txn, action, low_watermark):
        await release.wait()
        told.append(action)
        await real(topic, subscription, txn, action, low_watermark)

    service.end_txn_on_subscription = unreachable
    zombie, task2, task3 = [await connect(server.port) for _ in range(3)]
    await key_connect(zombie)
    txn = bits(await new_txn(zombie))
    added = await zombie.request("ADD_SUBSCRIPTION_TO_TXN", request_id=next(_ids), **txn,
                                 subscription=[pb.Subscription(topic=TOPIC, subscription="in")])
    assert not added.HasField("error")

    reply = await key_connect(task2)                   # (the driver waits 5 s at most)
    assert (reply.HasField("error"), reply.epoch) == (False, 1)
    assert await zombie.closed()
    end = await task2.request("END_TXN", request_id=next(_ids), txn_action=int(TxnAction.COMMIT), **txn)
    assert end.error == pb.ExpiredTransaction          # the zombie's txn never commits
    assert (await key_connect(task3)).epoch == 2       # nor does the next connect queue behind it
    assert not (await new_txn(task3)).HasField("error")
    assert told == []
    release.set()
    for _ in range(200):
        if told:
            break
        await asyncio.sleep(0.01)
    assert told == [TxnAction.ABORT]
