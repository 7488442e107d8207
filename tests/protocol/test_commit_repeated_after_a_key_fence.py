"""A COMMIT decided before a transaction key's fence stays committed, and the coordinator
answers its repeat (the answer was lost, the client sends END_TXN again after reconnecting)
with the truth. Found by an audit: over the wire, END_TXN checked the fence itself before the
coordinator did, and answered such a repeat ExpiredTransaction, which has the task redo work
that is already in. An ABORT of it, and any end of a transaction the fence aborted, is still
ExpiredTransaction."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.server import ProtocolServer
from pyengine.transaction import TxnAction
from tests.protocol.test_server_transaction_keys import TOPIC, bits, key_connect, new_txn
from tests.protocol.wire_driver import BaseCommand, WireClient

Connect = Callable[..., Awaitable[WireClient]]
_ids = iter(range(1, 1 << 30))


async def end_txn(client: WireClient, txn: dict[str, int], action: TxnAction) -> pb.CommandEndTxnResponse:
    return await client.request("END_TXN", request_id=next(_ids), txn_action=int(action), **txn)


async def test_a_commit_decided_before_the_fence_is_answered_committed_when_repeated(
        server: ProtocolServer, connect: Connect) -> None:
    task1, task2 = await connect(server.port), await connect(server.port)
    await key_connect(task1)
    committed = bits(await new_txn(task1))
    await task1.create_producer(TOPIC, producer_id=1, request_id=next(_ids))
    assert (await task1.publish(1, 0, b"in", **committed)).type == BaseCommand.SEND_RECEIPT
    assert not (await end_txn(task1, committed, TxnAction.COMMIT)).HasField("error")
    aborted = bits(await new_txn(task1))
    assert (await key_connect(task2)).epoch == 1          # the fence: task1's open txn is aborted
    assert await task1.closed()

    again = await connect(server.port)                    # task1, reconnected without its epoch
    repeated = await end_txn(again, committed, TxnAction.COMMIT)
    assert not repeated.HasField("error"), repeated.message
    assert (await end_txn(again, committed, TxnAction.ABORT)).error == pb.ExpiredTransaction
    for action in (TxnAction.COMMIT, TxnAction.ABORT):
        assert (await end_txn(again, aborted, action)).error == pb.ExpiredTransaction
