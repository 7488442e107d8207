"""PIP-84 consumer epochs, broker side, as Pulsar's (found by an audit: the field was ignored).

The broker keeps the epoch a consumer gives in SUBSCRIBE (`consumer_epoch`), raises it when a
REDELIVER_UNACKNOWLEDGED_MESSAGES carries a newer one (never lowers it), and puts it on every
MESSAGE of an Exclusive or Failover subscription (`CommandMessage.consumer_epoch`), so that a
Java client drops the messages still in flight from before its redelivery request. Pulsar's
Shared and Key_Shared dispatchers send no epoch; no epoch given, none is sent."""

from __future__ import annotations

from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.server import ProtocolServer
from tests.protocol.test_server_consume import produce
from tests.protocol.wire_driver import WireClient

Sub = pb.CommandSubscribe
TOPIC = "persistent://public/default/consumer-epoch"


async def epochs(client: WireClient, count: int) -> list[tuple[bytes, int | None]]:
    """The next `count` messages (other commands passed over): (payload, epoch or None when
    the field is absent)."""
    got = []
    while len(got) < count:
        cmd, raw = await client.receive_command()
        if cmd.type == pb.BaseCommand.MESSAGE:
            message = cmd.message
            got.append((raw.payload[-2:], message.consumer_epoch if message.HasField("consumer_epoch") else None))
    return got


async def test_failover_messages_carry_the_epoch_of_subscribe_then_of_each_newer_redeliver(
        server: ProtocolServer, client: WireClient) -> None:
    await produce(client, 2, topic=TOPIC)
    await client.subscribe(TOPIC, "s", sub_type=Sub.Failover, permits=10, consumer_epoch=0)
    assert await epochs(client, 2) == [(b"m0", 0), (b"m1", 0)]
    client.send("REDELIVER_UNACKNOWLEDGED_MESSAGES", consumer_id=0, consumer_epoch=3)
    assert await epochs(client, 2) == [(b"m0", 3), (b"m1", 3)]
    client.send("REDELIVER_UNACKNOWLEDGED_MESSAGES", consumer_id=0, consumer_epoch=2)     # older: kept at 3
    assert await epochs(client, 2) == [(b"m0", 3), (b"m1", 3)]
    client.send("REDELIVER_UNACKNOWLEDGED_MESSAGES", consumer_id=0)                       # none: kept
    assert await epochs(client, 2) == [(b"m0", 3), (b"m1", 3)]


async def test_an_exclusive_consumer_without_an_epoch_gets_one_from_its_first_redeliver(
        server: ProtocolServer, client: WireClient) -> None:
    await produce(client, 1, topic=TOPIC)
    await client.subscribe(TOPIC, "s", permits=10)
    assert await epochs(client, 1) == [(b"m0", None)]              # none given: none sent
    client.send("REDELIVER_UNACKNOWLEDGED_MESSAGES", consumer_id=0, consumer_epoch=1)
    assert await epochs(client, 1) == [(b"m0", 1)]


async def test_shared_messages_carry_no_epoch(server: ProtocolServer, client: WireClient) -> None:
    await produce(client, 1, topic=TOPIC)
    await client.subscribe(TOPIC, "s", sub_type=Sub.Shared, permits=10, consumer_epoch=4)
    assert await epochs(client, 1) == [(b"m0", None)]
    client.send("REDELIVER_UNACKNOWLEDGED_MESSAGES", consumer_id=0, consumer_epoch=5)
    assert await epochs(client, 1) == [(b"m0", None)]
