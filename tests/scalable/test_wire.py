"""DAG watch sessions over the binary protocol (commands 70-72), with a raw wire client."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.scalable.wire import dag_to_layout
from tests.protocol.conftest import client, connect, server, service  # noqa: F401  (fixtures)

T = "topic://public/default/orders"


async def test_lookup_pushes_the_dag_then_every_change(client, service):
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 2)
    client.send("SCALABLE_TOPIC_LOOKUP", session_id=7, topic=T)
    first = await client.expect("SCALABLE_TOPIC_UPDATE")
    assert first.session_id == 7 and not first.HasField("error")
    layout, controller, brokers = dag_to_layout(first.dag)
    assert layout.epoch == 0 and [s.segment_id for s in layout.active_segments] == [0, 1]
    assert brokers == {0: service.service_url, 1: service.service_url}
    await scalable.split_segment(T, 1)            # elects this broker, then splits
    seen = []
    while not seen or seen[-1][0].epoch < 1:
        update = await client.expect("SCALABLE_TOPIC_UPDATE")
        seen.append(dag_to_layout(update.dag)[:2])
    assert seen[-1][1] == service.service_url                   # the leader, once elected
    assert [s.segment_id for s in seen[-1][0].active_segments] == [0, 2, 3]
    assert first.dag.segments[0].state == pb.SEGMENT_ACTIVE
    client.send("SCALABLE_TOPIC_CLOSE", session_id=7)
    await scalable.split_segment(T, 0)
    await client.no_command(0.3)                                  # closed: nothing more


async def test_refusals_are_updates_with_an_error(client, service):
    scalable = await service.scalable_topics()
    client.send("SCALABLE_TOPIC_LOOKUP", session_id=1, topic="topic://public/default/missing")
    reply = await client.expect("SCALABLE_TOPIC_UPDATE")
    assert reply.session_id == 1 and reply.error == pb.TopicNotFound and not reply.HasField("dag")
    for bad in ("persistent://public/default/x", "segment://public/default/x/0000-ffff-0", "a/b/c/d", "",
                "public/default/orders"):
        client.send("SCALABLE_TOPIC_LOOKUP", session_id=2, topic=bad)
        reply = await client.expect("SCALABLE_TOPIC_UPDATE")
        assert reply.error == pb.InvalidTopicName, bad
    await scalable.create_topic(T)
    client.send("SCALABLE_TOPIC_LOOKUP", session_id=3, topic=T)
    assert not (await client.expect("SCALABLE_TOPIC_UPDATE")).HasField("error")
    client.send("SCALABLE_TOPIC_LOOKUP", session_id=3, topic=T)       # the id is in use
    reply = await client.expect("SCALABLE_TOPIC_UPDATE")
    assert reply.error == pb.NotAllowedError and "already open" in reply.message
    client.send("SCALABLE_TOPIC_CLOSE", session_id=99)                 # unknown: ignored
    await client.no_command(0.2)
    # the topic is deleted: the session ends with an error
    await scalable.delete_topic(T)
    reply = await client.expect("SCALABLE_TOPIC_UPDATE")
    assert reply.session_id == 3 and reply.error == pb.TopicNotFound


async def test_sessions_end_with_their_connection(server, service, connect):
    scalable = await service.scalable_topics()
    await scalable.create_topic(T)
    one = await connect(server.port)
    one.send("SCALABLE_TOPIC_LOOKUP", session_id=1, topic=T)
    await one.expect("SCALABLE_TOPIC_UPDATE")
    await one.close()
    other = await connect(server.port)
    other.send("SCALABLE_TOPIC_LOOKUP", session_id=1, topic=T)
    await other.expect("SCALABLE_TOPIC_UPDATE")
    await scalable.split_segment(T, 0)
    while dag_to_layout((await other.expect("SCALABLE_TOPIC_UPDATE")).dag)[0].epoch < 1:
        pass
    watches = len(service.metadata._watches)
    await other.close()
    for _ in range(100):                               # the server closes the session's watch
        if len(service.metadata._watches) < watches:
            break
        await asyncio.sleep(0.02)
    assert len(service.metadata._watches) == watches - 1


async def test_consumer_registration_over_the_wire(server, service, connect):
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 2)
    one = await connect(server.port)
    reply = await one.request("SCALABLE_CONSUMER_REGISTER", request_id=5, consumer_id=1, topic=T,
                              subscription="s", consumer_name="c1")
    assert reply.request_id == 5 and not reply.HasField("error")
    assert [s.segment_id for s in reply.segments] == [0, 1] and reply.segments[0].topic.startswith("segment://")
    again = await one.request("SCALABLE_CONSUMER_REGISTER", request_id=6, consumer_id=1, topic=T,
                              subscription="s", consumer_name="c1")
    assert again.error == pb.NotAllowedError
    for topic, code in (("persistent://public/default/x", pb.InvalidTopicName), ("public/default/orders",
                        pb.InvalidTopicName), ("topic://public/default/none", pb.TopicNotFound)):
        bad = await one.request("SCALABLE_CONSUMER_REGISTER", request_id=7, consumer_id=9, topic=topic,
                                subscription="s", consumer_name="c9")
        assert bad.error == code, topic
    two = await connect(server.port)
    reply = await two.request("SCALABLE_CONSUMER_REGISTER", request_id=1, consumer_id=1, topic=T,
                              subscription="s", consumer_name="c2")
    assert [s.segment_id for s in reply.segments] == [1]
    pushed = await one.expect("SCALABLE_CONSUMER_ASSIGNMENT")       # c1 lost segment 1 to c2
    assert pushed.consumer_id == 1 and [s.segment_id for s in pushed.segments] == [0]
    await one.close()                                                # c1 keeps its session (grace period)
    controller = await scalable.leader(T)
    for _ in range(100):
        consumers = (await controller.stats())["subscriptions"]["s"]["consumers"]
        if not consumers[0]["connected"]:
            break
        await asyncio.sleep(0.02)
    assert [(c["consumerName"], c["connected"], c["assignedSegments"]) for c in consumers] == [
        ("c1", False, [0]), ("c2", True, [1])]
    two.send("SCALABLE_CONSUMER_UNREGISTER", consumer_id=1)
    pushed_none = await two.no_command(0.2)
    assert pushed_none is None
    for _ in range(100):
        names = [c["consumerName"] for c in (await controller.stats())["subscriptions"]["s"]["consumers"]]
        if names == ["c1"]:
            break
        await asyncio.sleep(0.02)
    assert names == ["c1"]


@pytest.mark.parametrize("unregisters", [False, True], ids=["closes", "unregisters-and-closes"])
async def test_a_stale_connection_neither_disconnects_nor_unregisters_a_consumer_registered_again(
        server, service, connect, unregisters):
    # c1 registers again on a new connection while its old one is still open (a client that
    # reconnected before the broker saw the old one drop): what the old connection does later
    # must not touch the new registration.
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 2)
    old, new = await connect(server.port), await connect(server.port)
    for connection in (old, new):
        reply = await connection.request("SCALABLE_CONSUMER_REGISTER", request_id=1, consumer_id=1, topic=T,
                                         subscription="s", consumer_name="c1")
        assert [s.segment_id for s in reply.segments] == [0, 1]
    controller = await scalable.leader(T)

    async def c1() -> dict:
        return (await controller.stats())["subscriptions"]["s"]["consumers"]

    if unregisters:
        old.send("SCALABLE_CONSUMER_UNREGISTER", consumer_id=1)
    await old.close()
    for _ in range(250):                     # the server has seen the old connection go
        if len(server.connections) == 1:
            break
        await asyncio.sleep(0.02)
    assert len(server.connections) == 1
    await asyncio.sleep(0.05)                # (the unregister before it ran as a task of its own)
    assert [(c["consumerName"], c["connected"]) for c in await c1()] == [("c1", True)]
    await scalable.split_segment(T, 0)       # assignments still reach the new connection
    while True:
        pushed = await new.expect("SCALABLE_CONSUMER_ASSIGNMENT")
        if len(pushed.segments) > 2 or [s.segment_id for s in pushed.segments] != [0, 1]:
            break
    assert pushed.consumer_id == 1
    await new.close()                        # its own connection closing does start the grace period
    for _ in range(100):
        if not (await c1())[0]["connected"]:
            break
        await asyncio.sleep(0.02)
    assert [(c["consumerName"], c["connected"]) for c in await c1()] == [("c1", False)]


async def test_producers_and_consumers_attach_only_to_segments_that_exist(client, service):
    """A segment is created by its scalable topic's controller. Created on attach, a producer
    with a stale layout (its topic deleted) had its sends stored in a segment no scalable topic
    has, and a broker that does not own a segment held a second, empty copy of it."""
    scalable = await service.scalable_topics()
    await scalable.create_topic(T, 1)
    segment = (await scalable.get_layout(T)).all_segments[0].topic_name(T)
    assert (await client.create_producer(segment, producer_id=1, request_id=1)).producer_name
    await client.request("CLOSE_PRODUCER", producer_id=1, request_id=2)
    await scalable.delete_topic(T)
    for missing in (segment, "segment://public/default/never/0000-ffff-0"):
        reply = await client.create_producer(missing, producer_id=3, request_id=3)
        assert reply.error == pb.TopicNotFound and "does not exist" in reply.message
        reply = await client.subscribe(missing, "s", consumer_id=4, request_id=4)
        assert reply.error == pb.TopicNotFound
        assert not service.topic_exists(missing)
