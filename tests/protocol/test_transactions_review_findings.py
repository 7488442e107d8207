"""Review findings: the transaction coordinator's commands on the wire."""

from __future__ import annotations

from pyengine.protocol import pulsar_api_pb2 as pb
from core_ext.frames import encode_command
from pyengine.protocol.commands import serialize_command
from pyengine.transaction import TxnStatus
from pyengine_kernels import TxnId
from tests.protocol.test_server_transactions import _next_id, new_txn
from tests.protocol.wire_driver import WireClient


def _end_txn_frame(request_id: int, least: int, action_bytes: bytes) -> bytes:
    """END_TXN of txn (0, least) with `action_bytes` as its txn_action field (raw: an
    unknown enum value cannot be set through the generated class)."""
    body = pb.CommandEndTxn(request_id=request_id, txnid_most_bits=0, txnid_least_bits=least)
    raw = body.SerializeToString() + action_bytes
    command = pb.BaseCommand(type=pb.BaseCommand.END_TXN)
    command.endTxn.ParseFromString(raw)
    return encode_command(serialize_command(command))


async def test_end_txn_without_an_action_does_not_commit(client: WireClient, service) -> None:
    """END_TXN carrying no txn_action, or one that is neither COMMIT nor ABORT (proto2 keeps an
    unknown enum value aside and reads the field as unset), was taken as COMMIT: the proto's
    default. A malformed request committed the transaction; it is refused and changes nothing."""
    txn = await new_txn(client)
    least = txn.bits["txnid_least_bits"]
    for action_bytes in (b"", b"\x20\x07"):           # none; field 4 = 7
        request_id = _next_id()
        client.send_raw(_end_txn_frame(request_id, least, action_bytes))
        reply = await client.expect("END_TXN_RESPONSE")
        assert reply.request_id == request_id
        assert reply.error == pb.NotAllowedError, reply
        assert service.coordinator.get(TxnId(0, least)).status == TxnStatus.OPEN
    assert not (await txn.end(1)).HasField("error")  # a well-formed ABORT still ends it
    assert service.coordinator.get(TxnId(0, least)).status == TxnStatus.ABORTED
