"""An ACK's batch_size is a client's hint: the broker sizes a batch's ack set by the stored
entry (or, for no stored entry, by the bits the ack set carries). Taken as it came, a
batch_size of 2^31 - 1 on an entry not pending at the consumer made the broker build ack sets
of billions of bits, enough to exhaust its memory."""

from __future__ import annotations

from types import SimpleNamespace

from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.connection import ServerConnection
from pyengine_kernels import Position

HUGE = (1 << 31) - 1


def consumer_over(stored: dict[Position, int]) -> SimpleNamespace:
    """A consumer holding nothing pending, on a ledger whose entries hold `stored` messages."""
    ledger = SimpleNamespace(read_entry=lambda p: SimpleNamespace(num_messages=stored[p]) if p in stored else None)
    return SimpleNamespace(broker_consumer=SimpleNamespace(pending={}), topic=SimpleNamespace(ledger=ledger))


def message_id(entry: int, words: int, batch_size: int | None) -> pb.MessageIdData:
    message = pb.MessageIdData(ledgerId=3, entryId=entry, ack_set=[-1] * words)
    if batch_size is not None:
        message.batch_size = batch_size
    return message


def test_the_stored_entry_sizes_the_ack_not_the_clients_batch_size():
    ack = ServerConnection._individual_ack(consumer_over({Position(3, 0): 10}), message_id(0, 1, HUGE))
    assert ack.batch_size == 10


def test_an_entry_not_stored_is_sized_by_the_ack_sets_bits():
    consumer = consumer_over({})
    assert ServerConnection._individual_ack(consumer, message_id(7, 2, HUGE)).batch_size == 128
    assert ServerConnection._individual_ack(consumer, message_id(7, 2, 100)).batch_size == 100
    assert ServerConnection._individual_ack(consumer, message_id(7, 2, None)).batch_size == 128
