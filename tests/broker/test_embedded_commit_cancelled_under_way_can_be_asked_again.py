"""A commit (or abort) cancelled while it waits for the transaction's sends may be asked again,
as `pyengine.client`'s (the Java client keeps COMMITTING then too): nothing was decided yet.
The embedded transaction stayed "committing" for good, refusing both a second commit and an
abort (InvalidTxnStatusError), so the transaction stayed open until its timeout, and the plain
messages sent after its first one waited for it that long."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.broker import Broker
from tests.broker.helpers import GatedWriter, drain

T = "persistent://public/default/commit-cancelled"


@pytest.mark.parametrize("end", ["commit", "abort"])
async def test_an_end_cancelled_while_a_send_is_under_way_can_be_asked_again(tmp_path, end):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        txn = await broker.new_transaction()
        await producer.send(b"first", txn=txn)
        gate = GatedWriter(broker.service.env)
        try:
            send = asyncio.ensure_future(producer.send(b"second", txn=txn))
            await gate.next_commit()                          # the send is under way
            ending = asyncio.ensure_future(getattr(txn, end)())
            await asyncio.sleep(0.05)
            assert not ending.done()                          # it waits for the send
            ending.cancel()
            with pytest.raises(asyncio.CancelledError):
                await ending
        finally:
            gate.open()
        await send
        await getattr(txn, end)()                             # asked again: it goes on
        assert txn.state == ("committed" if end == "commit" else "aborted")
        await producer.send(b"plain")
        expected = [b"first", b"second", b"plain"] if end == "commit" else [b"plain"]
        assert [m.data for m in await drain(consumer)] == expected
