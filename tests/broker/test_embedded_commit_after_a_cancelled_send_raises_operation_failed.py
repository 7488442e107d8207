"""A commit whose transaction had a send cancelled under way aborts and raises
TransactionHasOperationFailedError, as `pyengine.client`'s commit does (the Java client's
TransactionHasOperationFailedException): code written against the network client catches that
class. The embedded commit raised a bare PulsarError ("CancelledError: ...") instead."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.broker import Broker
from pyengine.client.errors import TransactionHasOperationFailedError
from tests.broker.helpers import drain

T = "persistent://public/default/cancelled-send"


async def test_a_commit_after_a_cancelled_send_raises_transaction_has_operation_failed(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        txn = await broker.new_transaction()
        await producer.send(b"stored", txn=txn)
        cancelled = asyncio.ensure_future(producer.send(b"cancelled", txn=txn))
        await asyncio.sleep(0)
        cancelled.cancel()
        with pytest.raises(TransactionHasOperationFailedError, match="cancelled") as info:
            await txn.commit()
        assert isinstance(info.value.__cause__, asyncio.CancelledError)
        assert txn.state == "aborted"
        await producer.send(b"plain")
        assert [m.data for m in await drain(consumer)] == [b"plain"]
