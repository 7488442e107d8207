"""A DAG watch session whose topic is deleted while the session is being opened (between the
existence check and the first read of the layout): the client is told (an update with the
error) and the session id is free again, rather than left "already open" for ever with no
answer at all."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from pyengine.broker.service import BrokerService
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.server import ProtocolServer
from tests.protocol.wire_driver import WireClient

Connect = Callable[..., Awaitable[WireClient]]
SCALABLE = "topic://public/default/deleted-while-watched"


async def test_a_topic_deleted_while_its_watch_opens_is_an_error_and_frees_the_session_id(
        service: BrokerService, server: ProtocolServer, connect: Connect, monkeypatch: pytest.MonkeyPatch) -> None:
    scalable = await service.scalable_topics()
    await scalable.create_topic(SCALABLE)
    resources = scalable.resources
    load = resources.load
    deleted = False

    async def load_after_a_delete(topic: Any) -> Any:
        # The topic is deleted after the session saw it exist, before it reads its layout.
        nonlocal deleted
        if not deleted:
            deleted = True
            await scalable.delete_topic(SCALABLE)
        return await load(topic)

    monkeypatch.setattr(resources, "load", load_after_a_delete)
    one = await connect(server.port)
    one.send("SCALABLE_TOPIC_LOOKUP", session_id=3, topic=SCALABLE)
    update = await one.expect("SCALABLE_TOPIC_UPDATE")
    assert update.session_id == 3 and update.error == pb.TopicNotFound, update
    # The id is not held by a session that never opened: once the topic is back it opens.
    monkeypatch.undo()
    await scalable.create_topic(SCALABLE)
    one.send("SCALABLE_TOPIC_LOOKUP", session_id=3, topic=SCALABLE)
    update = await one.expect("SCALABLE_TOPIC_UPDATE")
    assert update.session_id == 3 and not update.HasField("error"), update
    assert server.connections and all(len(c.scalable.sessions) <= 1 for c in server.connections)
