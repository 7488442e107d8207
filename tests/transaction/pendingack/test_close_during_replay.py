"""A handle closed while its replay is under way (the subscription or its topic closing during
a long replay) must stay closed. The replay used to set READY when it finished, whatever had
happened meanwhile, so the closed handle accepted acks and commits again."""

import asyncio

import pytest

from pyengine.errors import ServiceNotReadyError
from pyengine.transaction.pendingack import IndividualAck
from pyengine.transaction.pendingack.handle import HandleState, PendingAckHandleImpl
from pyengine.transaction.pendingack.log_store import LogPendingAckStore
from tests.transaction.pendingack.helpers import SHARED, T1, T2, T3, open_subscription


async def test_a_handle_closed_during_its_replay_stays_closed(env):
    sub = await open_subscription(env, 6, sub_type=SHARED)
    for index, txn in enumerate((T1, T2, T3)):
        await sub.handle.individual_ack(txn, [IndividualAck(sub.positions[index])])

    handle = PendingAckHandleImpl(sub.cursor, LogPendingAckStore.for_cursor(sub.cursor),
                                  subscription_type=SHARED, replay_chunk=1)
    replay = asyncio.ensure_future(handle.replay())
    await asyncio.sleep(0)                   # the replay read its first chunk and yields
    assert handle.state is HandleState.REPLAYING
    await handle.close()
    with pytest.raises(ServiceNotReadyError, match="closed while replaying"):
        await replay
    assert handle.state is HandleState.CLOSED
    with pytest.raises(ServiceNotReadyError):
        await handle.individual_ack(T1, [IndividualAck(sub.positions[4])])
    with pytest.raises(ServiceNotReadyError):
        await handle.commit(T2, -1)
    # Nothing the closed handle might have done reached the log or the cursor.
    assert sub.cursor.mark_delete < sub.positions[0]
    assert sub.handle.stats()["log_records"] == 3
