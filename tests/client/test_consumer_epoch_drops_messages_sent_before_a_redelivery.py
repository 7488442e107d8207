"""PIP-84's consumer epoch, client side, as the Java client's ConsumerImpl: an Exclusive or
Failover consumer raises its epoch with each redeliver-all (redeliver_unacknowledged_messages,
and the redelivery its negative acks ask for) and sends it with REDELIVER_UNACKNOWLEDGED_MESSAGES
and every SUBSCRIBE; a MESSAGE stamped with a lower epoch was sent before the redelivery and is
dropped, its permits given back. The MESSAGEs here are written into the client's connection
as a broker would send them."""

from __future__ import annotations

import asyncio

import pytest

from core_ext.frames import encode_payload_frame
from pyengine.client.connection import ClientConnection
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.commands import base_command, serialize_command
from tests.protocol.wire_driver import metadata

T = pb.BaseCommand
TOPIC = "persistent://public/default/consumer-epoch"


def record_commands(monkeypatch, *types: int) -> list[pb.BaseCommand]:
    """The commands of `types` any client connection writes from now on."""
    written: list[pb.BaseCommand] = []
    send_command = ClientConnection.send_command

    def recording(connection, cmd) -> None:
        if cmd.type in types:
            written.append(cmd)
        send_command(connection, cmd)
    monkeypatch.setattr(ClientConnection, "send_command", recording)
    return written


def deliver(handler, entry_id: int, epoch: int | None, messages_in_batch: int | None = None) -> None:
    """A MESSAGE for `handler`, from the broker's side of its connection (`epoch` None: unstamped)."""
    fields = {} if epoch is None else {"consumer_epoch": epoch}
    command = serialize_command(base_command(T.MESSAGE, consumer_id=handler.consumer_id,
                                             message_id=pb.MessageIdData(ledgerId=999, entryId=entry_id), **fields))
    batch = {} if messages_in_batch is None else {"num_messages_in_batch": messages_in_batch}
    handler.connection.data_received(encode_payload_frame(command, metadata(sequence_id=entry_id, **batch),
                                                          f"m{entry_id}".encode()))


@pytest.mark.parametrize("consumer_type", ["exclusive", "failover"])
async def test_a_redelivery_raises_the_epoch_and_drops_the_messages_stamped_before(client, monkeypatch,
                                                                                   consumer_type):
    consumer = await client.subscribe(TOPIC, "s", consumer_type=consumer_type, receiver_queue_size=2)
    handler = consumer._handlers[-1]
    assert handler.epoch == 0
    sent = record_commands(monkeypatch, T.REDELIVER_UNACKNOWLEDGED_MESSAGES, T.FLOW)
    await consumer.redeliver_unacknowledged_messages()
    redelivers = [c.redeliverUnacknowledgedMessages for c in sent if c.type == T.REDELIVER_UNACKNOWLEDGED_MESSAGES]
    assert [(r.consumer_epoch, list(r.message_ids)) for r in redelivers] == [(1, [])]
    assert handler.epoch == 1
    sent.clear()

    deliver(handler, 0, epoch=0, messages_in_batch=3)           # in flight before the redelivery
    deliver(handler, 1, epoch=1)
    deliver(handler, 2, epoch=None)                             # a broker without epochs
    assert [(await consumer.receive(timeout=2)).data for _ in range(2)] == [b"m1", b"m2"]
    with pytest.raises(TimeoutError):
        await consumer.receive(timeout=0.1)
    # The dropped entry's 3 permits came back (the queue's half is 1: at once), then 1 per receive.
    assert [c.flow.messagePermits for c in sent if c.type == T.FLOW] == [3, 1, 1]


async def test_negative_acks_of_an_exclusive_consumer_raise_the_epoch(client, monkeypatch):
    producer = await client.create_producer(TOPIC)
    consumer = await client.subscribe(TOPIC, "s", negative_ack_redelivery_delay_ms=0)
    await producer.send(b"x")
    sent = record_commands(monkeypatch, T.REDELIVER_UNACKNOWLEDGED_MESSAGES)
    await consumer.negative_acknowledge(await consumer.receive(timeout=5))
    assert [c.redeliverUnacknowledgedMessages.consumer_epoch for c in sent] == [1]
    assert (await consumer.receive(timeout=5)).data == b"x"     # the broker sends it again


async def test_a_shared_consumer_keeps_its_epoch(client, monkeypatch):
    consumer = await client.subscribe(TOPIC, "s", consumer_type="shared")
    handler = consumer._handlers[-1]
    await consumer.redeliver_unacknowledged_messages()
    assert handler.epoch == 0
    deliver(handler, 0, epoch=0)
    assert (await consumer.receive(timeout=2)).data == b"m0"


async def test_subscribe_carries_the_epoch_again_on_reconnect(broker, client, monkeypatch):
    consumer = await client.subscribe(TOPIC, "s")
    for _ in range(2):
        await consumer.redeliver_unacknowledged_messages()
    subscribes: list[pb.BaseCommand] = []
    send_request = ClientConnection.send_request

    def recording(connection, cmd):
        if cmd.type == T.SUBSCRIBE:
            subscribes.append(cmd)
        return send_request(connection, cmd)
    monkeypatch.setattr(ClientConnection, "send_request", recording)
    await broker.restart()
    handler = consumer._handlers[-1]
    for _ in range(100):
        if handler.state == "ready" and subscribes:
            break
        await asyncio.sleep(0.05)
    assert [c.subscribe.consumer_epoch for c in subscribes] == [2]
