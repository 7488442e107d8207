"""A CLOSE_PRODUCER / CLOSE_CONSUMER that reaches the broker while that producer or consumer
is still being created (a client that gave up waiting, or closes at once): the close is
answered SUCCESS and what the creation then makes is discarded (Apache's ServerCnx does the
same: "Closed consumer before creation was complete"), so it never holds a name, an exclusive
subscription or an exclusive topic on a connection that believes it closed it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.server import ProtocolServer
from tests.protocol.wire_driver import BaseCommand, WireClient, frame

Connect = Callable[..., Awaitable[WireClient]]
TOPIC = "persistent://public/default/close-before-created"


async def _answers(client: WireClient, count: int) -> dict[int, object]:
    """The next `count` answers by request id (PONGs skipped)."""
    answers: dict[int, object] = {}
    while len(answers) < count:
        cmd = await client.receive()
        if cmd.type == BaseCommand.PONG:
            continue
        body = getattr(cmd, cmd.WhichOneof("body"))
        answers[body.request_id] = (BaseCommand.Type.Name(cmd.type), body)
    return answers


async def test_a_consumer_closed_while_subscribing_does_not_hold_its_subscription(
        server: ProtocolServer, client: WireClient, connect: Connect) -> None:
    client.send_raw(frame("SUBSCRIBE", topic=TOPIC, subscription="sub", subType=pb.CommandSubscribe.Exclusive,
                          consumer_id=0, request_id=1)
                    + frame("CLOSE_CONSUMER", consumer_id=0, request_id=2))
    answers = await _answers(client, 2)
    assert answers[2][0] == "SUCCESS"
    assert answers[1][0] == "ERROR"          # the subscribe was given up: it made nothing
    # Nothing of it is left on the connection or on the subscription.
    other = await connect(server.port)
    reply = await other.subscribe(TOPIC, "sub", consumer_id=7, request_id=3)
    assert isinstance(reply, pb.CommandSuccess), reply
    # And the id may be used again on the first connection.
    reply = await client.subscribe(TOPIC, "other-sub", consumer_id=0, request_id=4)
    assert isinstance(reply, pb.CommandSuccess), reply


async def test_a_producer_closed_while_being_created_does_not_hold_the_topic(
        server: ProtocolServer, client: WireClient, connect: Connect) -> None:
    client.send_raw(frame("PRODUCER", topic=TOPIC, producer_id=0, request_id=1, producer_access_mode=pb.Exclusive)
                    + frame("CLOSE_PRODUCER", producer_id=0, request_id=2))
    answers = await _answers(client, 2)
    assert answers[2][0] == "SUCCESS"
    assert answers[1][0] == "ERROR"
    # The topic is not held exclusively by a producer its client closed.
    other = await connect(server.port)
    reply = await other.create_producer(TOPIC, producer_access_mode=pb.Exclusive)
    assert isinstance(reply, pb.CommandProducerSuccess), reply
    # The id is free again on the first connection, which is still open.
    reply = await client.create_producer("persistent://public/default/elsewhere", producer_id=0, request_id=5)
    assert isinstance(reply, pb.CommandProducerSuccess), reply
