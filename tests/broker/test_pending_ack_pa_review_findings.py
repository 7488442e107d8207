"""Review findings (pa) on the v4 pending acknowledgements as the subscription uses them."""

import asyncio

import pytest

from pyengine.broker import Broker
from tests.broker.helpers import drain
from tests.waiting import eventually

T = "persistent://public/default/pending-ack-pa-review"


@pytest.mark.parametrize("kind", ["shared", "exclusive"])
async def test_an_abort_whose_first_call_was_abandoned_gives_back_on_the_repeat(tmp_path, kind):
    """The coordinator abandons an END_TXN_ON_SUBSCRIPTION that takes too long (its call
    timeout cancels the call) and repeats it. The handle's abort went on (it is shielded),
    but the subscription's give-back after it was lost with the cancelled call, and the
    repeat found the transaction already ended in the handle: nothing to give back. After a
    reload (nothing in flight at a consumer: the dispatcher passed over what the transaction
    held), its messages were stranded, neither acknowledged nor ever delivered again."""
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type=kind, initial_position="earliest")
        for i in range(3):
            await producer.send(b"m%d" % i)
        got = await drain(consumer)
        txn = await broker.new_transaction()
        if kind == "shared":
            for message in got:
                await consumer.acknowledge(message, txn=txn)
        else:
            await consumer.acknowledge_cumulative(got[-1], txn=txn)
        await broker.service.unload_topic(T)
        # The consumer attaches again to the topic loaded again (on its own time: waited for).
        await eventually(lambda: T in broker.service.topics and broker.service.topics[T].subscriptions.get("s")
                         is not None and broker.service.topics[T].subscriptions["s"].consumers)
        assert await drain(consumer, 0.5) == []          # held by the open transaction
        subscription = broker.service.topics[T].subscriptions["s"]
        abandoned = asyncio.ensure_future(subscription.end_txn(txn.txn_id, False, -1))
        await asyncio.sleep(0)                           # the handle's abort is under way
        abandoned.cancel()
        while subscription.pending_ack._ending:
            await asyncio.sleep(0.01)
        await subscription.end_txn(txn.txn_id, False, -1)     # the coordinator's repeat
        given_back = []
        while len(given_back) < 3:
            given_back.append((await consumer.receive(timeout=10)).data)
        assert sorted(given_back) == [b"m0", b"m1", b"m2"]
        await txn.abort()


@pytest.mark.parametrize("entry_id", [-1, None])
@pytest.mark.parametrize("how", ["plain", "txn", "txn-cumulative"])
async def test_an_ack_of_a_position_that_names_no_entry_is_refused_as_not_allowed(tmp_path, how, entry_id):
    """An acknowledgement of a message id that names no entry ((-1, -1), (ledger, -1): what a
    client's MessageId.earliest or a malformed id decodes to) on a durable subscription
    reached the pending acks' checks, whose ValueError the wire answered as an UnknownError
    ("ValueError: position -1:-1 does not name an entry"). It is the client's bad input:
    NotAllowedError, as an ack past the last entry is; nothing of the request is taken."""
    from pyengine.errors import NotAllowedError
    from pyengine.transaction.pendingack import IndividualAck
    from pyengine_kernels import Position

    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(T)
        consumer = await broker.subscribe(T, "s", consumer_type="exclusive", initial_position="earliest")
        for i in range(2):
            await producer.send(b"m%d" % i)
        got = await drain(consumer)
        subscription = broker.service.topics[T].subscriptions["s"]
        first = got[0].message_id.position
        bad = Position(-1, -1) if entry_id is None else Position(first.ledger_id, entry_id)
        txn = await broker.new_transaction()
        with pytest.raises(NotAllowedError, match="names no entry"):
            if how == "plain":
                await subscription.ack_individual(None, [IndividualAck(first), IndividualAck(bad)])
            elif how == "txn":
                await subscription.ack_with_transaction(None, txn.txn_id, [IndividualAck(first), IndividualAck(bad)])
            else:
                await subscription.ack_with_transaction(None, txn.txn_id, cumulative=bad)
        assert not subscription.cursor.is_acked(first)
        assert subscription.pending_ack.individual_ack_positions == {}
        await txn.abort()
