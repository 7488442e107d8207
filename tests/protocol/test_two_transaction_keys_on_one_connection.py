"""Found by an audit: a second transaction key connected over a connection that already held a
key on the same coordinator replaced the first key's session. NEW_TXN names no key, so the
connection could no longer tell which key a transaction is for, and when the connection closed
the first key still counted it as its holder (listed as connected, its closed connection kept
in memory until the key's next connect). A connection holds one key per coordinator: a second
one is refused before it takes an epoch."""

from __future__ import annotations

import asyncio

from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.server import ProtocolServer
from pyengine.transaction.coordinator.keys import ANONYMOUS, coordinator_for
from tests.protocol.conftest import NUM_COORDINATORS
from tests.protocol.test_server_transaction_keys import TC, key_connect, new_txn
from tests.protocol.wire_driver import WireClient

OTHER = next(k for k in (f"other-{n}" for n in range(1000))
             if coordinator_for(ANONYMOUS, k, NUM_COORDINATORS) == TC)
KEY = "task-7"


async def test_a_second_key_on_the_same_coordinator_is_refused(server: ProtocolServer, service,
                                                               client: WireClient) -> None:
    keys = service.coordinator.keys
    assert (await key_connect(client, key=KEY)).epoch == 0
    second = await key_connect(client, key=OTHER)
    assert second.error == pb.NotAllowedError and KEY in second.message
    assert not second.HasField("epoch")
    assert [state.key for state in keys.keys()] == [KEY]      # no epoch taken for the other key
    assert (await key_connect(client, key=KEY, epoch=0)).epoch == 1   # its own key still reconnects
    assert not (await new_txn(client)).HasField("error")
    await client.close()
    for _ in range(200):
        if not keys.info(keys.find(ANONYMOUS, KEY)).connected:
            break
        await asyncio.sleep(0.01)
    assert not keys.info(keys.find(ANONYMOUS, KEY)).connected


async def test_concurrent_connects_of_two_keys_on_one_connection_give_one(server: ProtocolServer, service,
                                                                          client: WireClient) -> None:
    for request_id, key in ((1, KEY), (2, OTHER)):       # the second before the first is answered
        client.send("TC_CLIENT_CONNECT_REQUEST", request_id=request_id, tc_id=TC, transaction_key=key, epoch=-1)
    replies = {reply.request_id: reply for reply in [await client.expect("TC_CLIENT_CONNECT_RESPONSE"),
                                                     await client.expect("TC_CLIENT_CONNECT_RESPONSE")]}
    assert replies[1].epoch == 0 and not replies[1].HasField("error")
    assert replies[2].error == pb.NotAllowedError and not replies[2].HasField("epoch")
    assert len(list(service.coordinator.keys.keys())) == 1


async def test_keys_of_different_coordinators_share_a_connection_and_are_released_on_close(
        server: ProtocolServer, service, client: WireClient) -> None:
    keys = service.coordinator.keys
    elsewhere = next(k for k in (f"far-{n}" for n in range(1000))
                     if coordinator_for(ANONYMOUS, k, NUM_COORDINATORS) != TC)
    assert (await key_connect(client, key=KEY)).epoch == 0
    reply = await key_connect(client, key=elsewhere, tc_id=coordinator_for(ANONYMOUS, elsewhere, NUM_COORDINATORS))
    assert reply.epoch == 0
    await client.close()
    for _ in range(200):
        if not any(keys.info(state).connected for state in keys.keys()):
            break
        await asyncio.sleep(0.01)
    assert not any(keys.info(state).connected for state in keys.keys())
