"""A transactional cumulative ack that crosses the broker's own rewind is a conflict.

On Exclusive/Failover the dispatcher passes over messages another transaction's acks hold (as
Pulsar's filterEntriesForConsumer does), so a consumer that takes over from one whose
transaction is still open gets the later messages first. When that transaction aborts (the
coordinator times it out: its owner is gone), the subscription gives the held messages back
and sends the stream again, in order, but the consumer's application may already hold the
later copies and ack one cumulatively before the new stream reaches it: its ack then covered
the given-back messages unprocessed, and they were lost (the soak's cumulative exactly-once
pipeline, 2 values of one batch, after a broker kill). The client cannot tell (the ack left
before the stream came again), so the broker refuses such an ack until the consumer asks for
the stream again (a redeliver-all: an aborted transaction's client does it)."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.errors import TransactionConflictError
from pyengine.transaction import TxnAction
from tests.broker.helpers import drain
from tests.client.conftest import broker, client  # noqa: F401  (fixtures)

TOPIC = "persistent://public/default/cumulative-across-rewind"


def _hold_incoming(consumer) -> list:
    """The consumer's MESSAGE frames are held (a slow network) until released."""
    handler = next(iter(consumer._handlers.values()))
    held, on_message = [], handler.on_message
    handler.on_message = lambda command, frame: held.append((command, frame))

    def release() -> None:
        handler.on_message = on_message
        for command, frame in held:
            on_message(command, frame)

    return release


@pytest.mark.parametrize("ended_by", ["abort", "commit"])
@pytest.mark.parametrize("batched", [False, True])
async def test_a_cumulative_ack_sent_before_the_rewound_stream_arrived_is_refused(client, broker, batched, ended_by):
    producer = await client.create_producer(TOPIC, batching_enabled=batched, batching_max_publish_delay_ms=50)
    await asyncio.gather(*(producer.send(b"m%d" % i) for i in range(7)))
    first = await client.subscribe(TOPIC, "s", consumer_type="failover", initial_position="earliest")
    taken = [await first.receive(timeout=5) for _ in range(4)]
    open_txn = await client.new_transaction(60_000)
    await first.acknowledge_cumulative(taken[-1], txn=open_txn)       # m0..m3 held
    await first.close()                   # its owner is gone; the transaction stays open
    second = await client.subscribe(TOPIC, "s", consumer_type="failover", initial_position="earliest")
    later = [await second.receive(timeout=5) for _ in range(3)]
    assert [m.data for m in later] == [b"m4", b"m5", b"m6"]          # passed over the held ones
    release = _hold_incoming(second)
    # The coordinator aborts it, as on its timeout: m0..m3 come back, the stream again in order.
    await broker.service.coordinator.end_transaction(open_txn.txn_id, TxnAction.ABORT)
    txn = await client.new_transaction()
    with pytest.raises(TransactionConflictError, match="given back"):
        await second.acknowledge_cumulative(later[-1], txn=txn)
    if ended_by == "abort":
        await txn.abort()                 # the client's abort asks for the stream again
    else:                                 # as an abort: a commit with a failed ack aborts (Java's)
        with pytest.raises(TransactionConflictError):
            await txn.commit()
    release()
    again = await drain(second, 0.3)
    assert [m.data for m in again] == [b"m%d" % i for i in range(7)]
    txn = await client.new_transaction()
    await second.acknowledge_cumulative(again[-1], txn=txn)           # the new stream: accepted
    await txn.commit()
    check = await client.subscribe(TOPIC, "s", consumer_type="failover", initial_position="earliest")
    await second.close()
    assert await drain(check, 0.3) == []

