"""Review findings: transaction keys on the wire (TC_CLIENT_CONNECT, NEW_TXN)."""

from __future__ import annotations

from core_ext.frames import encode_command
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.commands import base_command, serialize_command
from pyengine.protocol.server import ProtocolServer
from tests.protocol.wire_driver import WireClient


async def test_a_transaction_key_that_is_not_utf8_is_refused_as_an_invalid_key(server: ProtocolServer,
                                                                                client: WireClient) -> None:
    """A `transaction_key` whose bytes are not UTF-8 reaches the broker as bytes (proto2
    string fields are not checked by the parser): the key check raised TypeError, answered
    as an UnknownError and logged as a broker failure. It is a malformed key: NotAllowed, as
    for the other invalid keys (pyengine.protocol.text refuses it before the handler), and
    the connection keeps working."""
    command = serialize_command(base_command("TC_CLIENT_CONNECT_REQUEST", request_id=1, tc_id=0,
                                             transaction_key="\u00e9\u00e9", epoch=-1))
    assert command.count("\u00e9\u00e9".encode()) == 1
    client.send_raw(encode_command(command.replace("\u00e9\u00e9".encode(), b"\xff\xfe\xff\xfe")))
    reply = await client.expect("TC_CLIENT_CONNECT_RESPONSE")
    assert reply.error == pb.NotAllowedError and "transaction_key is not UTF-8" in reply.message
    assert not reply.HasField("epoch")
    ok = await client.request("TC_CLIENT_CONNECT_REQUEST", request_id=2, tc_id=0)
    assert not ok.HasField("error")
