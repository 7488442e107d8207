"""Consumers still connected to a broker that lost the controller leadership (its metadata
session ended, the process and the connections alive) register again with the new leader.
Found by an audit: they were not told, so the new leader evicted them after the grace period
while they went on reading their old segments, and they never followed a split."""

from __future__ import annotations

import asyncio
import inspect

from pyengine.broker.service import BrokerConfig, BrokerService
from pyengine.client import Client
from pyengine.protocol.server import ProtocolServer

T = "topic://public/default/orders"


async def until(predicate, timeout: float = 10) -> None:
    """Wait until `predicate()` (a bool, or an awaitable of one) holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not (await result if inspect.isawaitable(result := predicate()) else result):
        assert loop.time() < deadline, "the condition never held"
        await asyncio.sleep(0.05)


async def test_consumers_register_again_when_the_leadership_moves(tmp_path):
    service = BrokerService(BrokerConfig(data_dir=tmp_path / "data", sync=False, num_coordinators=1,
                                         scalable_session_ttl=0.5, scalable_grace_period=1.0))
    await service.start()
    server = ProtocolServer(service, "127.0.0.1", 0, liveness_timeout=0.5)
    await server.start()
    service.service_url = f"pulsar://127.0.0.1:{server.port}"
    try:
        async with Client(service.service_url, operation_timeout_seconds=10) as client:
            scalable = await service.scalable_topics()
            await scalable.create_topic(T, 2)
            stream = await client.subscribe_stream(T, "s", "c1")
            assert stream.assigned == [0, 1]
            # the session expires; nothing else breaks. The next one is long-lived: a stall of a
            # loaded machine must not expire it too while the test checks the new leader
            scalable.session_ttl = 5.0
            scalable.session_ttl = 5.0                    # the next session: long-lived
            scalable._session.abandon()
            await until(lambda: scalable._session is None or not scalable._session.alive)
            controller = await scalable.leader(T, timeout=5)      # a new controller leads
            await controller.wait_leading(5)

            async def registered_and_connected() -> bool:
                consumers = (await controller.stats())["subscriptions"]["s"]["consumers"]
                return [(c["consumerName"], c["connected"]) for c in consumers] == [("c1", True)]

            await until(registered_and_connected)
            await asyncio.sleep(1.5)                     # past the grace period: still there
            assert await registered_and_connected()
            await scalable.split_segment(T, 0)
            await until(lambda: sorted(stream.assigned) == [1, 2, 3])
            await stream.close()
    finally:
        await server.stop()
        await service.close()


async def test_a_stream_consumer_leaves_a_sealed_parent_drained_under_a_new_leader(tmp_path):
    """The parent held back for a split's children and the children share the layout epoch:
    the new leader took the stored assignment as up to date and never re-checked the drain,
    so the consumer kept reading the sealed parent and the children were never read."""
    service = BrokerService(BrokerConfig(data_dir=tmp_path / "data", sync=False, num_coordinators=1,
                                         scalable_session_ttl=0.5, scalable_grace_period=5.0))
    await service.start()
    server = ProtocolServer(service, "127.0.0.1", 0, liveness_timeout=0.5)
    await server.start()
    service.service_url = f"pulsar://127.0.0.1:{server.port}"
    try:
        async with Client(service.service_url, operation_timeout_seconds=10) as client:
            scalable = await service.scalable_topics()
            await scalable.create_topic(T, 1)
            stream = await client.subscribe_stream(T, "s", "c1")
            producer = await client.create_producer(T)
            await producer.send(b"before", key="k")
            await scalable.split_segment(T, 0)            # the parent keeps a backlog: held back
            await until(lambda: stream.assigned == [0] and stream.layout_epoch == 1)
            scalable.session_ttl = 5.0                    # the next session: long-lived
            scalable._session.abandon()
            await until(lambda: scalable._session is None or not scalable._session.alive)
            controller = await scalable.leader(T, timeout=5)
            await controller.wait_leading(5)
            message = await stream.receive(timeout=5)
            assert message.data == b"before"
            await stream.acknowledge(message)
            await until(lambda: sorted(stream.assigned) == [1, 2])
            await producer.send(b"after", key="k")
            assert (await stream.receive(timeout=5)).data == b"after"
            await producer.close()
            await stream.close()
    finally:
        await server.stop()
        await service.close()
