"""`scalableTopicEnabled=false` (PIP-468's switch; `pyengine serve --no-scalable-topics`): the
broker refuses topic:// and segment:// names on every entry point, with a clear error, runs no
controller and writes nothing for them; partitioned and non-partitioned topics are unaffected."""

from __future__ import annotations

import argparse

import aiohttp
import pytest

from pyengine.admin import AdminServer
from pyengine.broker.service import BrokerConfig, BrokerService
from pyengine.cli import serve
from pyengine.errors import NotAllowedError
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.server import ProtocolServer
from tests.admin.conftest import Api
from tests.protocol.wire_driver import WireClient

T = "topic://public/default/orders"
SEGMENT = "segment://public/default/orders/0000-ffff-0"


@pytest.fixture
async def service(tmp_path):
    broker = BrokerService(BrokerConfig(data_dir=tmp_path / "data", sync=False, num_coordinators=2,
                                        scalable_topic_enabled=False))
    await broker.start()
    yield broker
    await broker.close()


async def test_the_python_api_refuses_and_starts_nothing(service):
    for _ in range(2):
        with pytest.raises(NotAllowedError, match="scalableTopicEnabled=false"):
            await service.scalable_topics()
    with pytest.raises(NotAllowedError, match="scalableTopicEnabled=false"):
        await service.get_topic(SEGMENT)
    assert service._scalable is None and not service.topic_exists(SEGMENT)
    topic = await service.get_topic("persistent://public/default/plain")     # other topics: as ever
    assert topic.name == "persistent://public/default/plain"


async def test_admin_answers_405_and_creates_nothing(service):
    admin = AdminServer(service, port=0)
    await admin.start()
    try:
        async with aiohttp.ClientSession() as session:
            api = Api(session, admin.url)
            for method, path in (("PUT", "/admin/v2/scalable/public/default/orders"),
                                 ("GET", "/admin/v2/scalable/public/default"),
                                 ("POST", "/admin/v2/scalable/public/default/orders/split/0"),
                                 ("PUT", "/admin/v2/segments/public/default/orders/0000-ffff-0")):
                reply = await api.call(method, path)
                assert reply.status == 405, (method, path, reply)
                assert "scalableTopicEnabled=false" in reply.body["reason"]
            assert (await api.put("/admin/v2/persistent/public/default/plain")).status == 204
    finally:
        await admin.stop()
    assert await service.metadata.get_children("/topics/public/default") == []


async def test_the_wire_refuses_lookups_producers_and_consumers(service):
    server = ProtocolServer(service, "127.0.0.1", 0)
    await server.start()
    client = await WireClient.connect(server.port)
    try:
        client.send("SCALABLE_TOPIC_LOOKUP", session_id=1, topic=T)
        reply = await client.expect("SCALABLE_TOPIC_UPDATE")
        assert reply.error == pb.NotAllowedError and "scalableTopicEnabled=false" in reply.message
        body = await client.request("SCALABLE_CONSUMER_REGISTER", consumer_id=1, request_id=1, topic=T,
                                    subscription="s", consumer_name="c")
        assert body.error == pb.NotAllowedError and "scalableTopicEnabled=false" in body.message
        reply = await client.create_producer(SEGMENT, producer_id=1, request_id=2)
        assert reply.error == pb.NotAllowedError and "scalableTopicEnabled=false" in reply.message
        reply = await client.subscribe(SEGMENT, "s", consumer_id=2, request_id=3)
        assert reply.error == pb.NotAllowedError
        assert (await client.create_producer("persistent://public/default/plain", producer_id=3,
                                             request_id=4)).producer_name
    finally:
        await client.close()
        await server.stop()


def test_the_serve_flag(tmp_path):
    def config(*argv: str) -> BrokerConfig:
        parser = argparse.ArgumentParser()
        serve.add_parser(parser.add_subparsers(dest="command"))
        return serve.broker_config(parser.parse_args(["serve", "--data-dir", str(tmp_path), *argv]))

    assert config().scalable_topic_enabled is True
    assert config("--no-scalable-topics").scalable_topic_enabled is False
