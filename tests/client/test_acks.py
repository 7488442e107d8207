"""How acknowledgements are put on the wire."""

from pyengine.client.consumer import _ack_id, _cumulative_target
from pyengine.client.message import MessageId


def _unsigned(words):
    return [w & (2**64 - 1) for w in words]


def test_a_plain_message_is_acked_by_its_entry():
    data = _ack_id(MessageId(3, 7))
    assert (data.ledgerId, data.entryId) == (3, 7)
    assert not data.ack_set and not data.HasField("batch_size")


def test_a_batch_message_clears_only_its_bit():
    data = _ack_id(MessageId(3, 7, batch_index=1, batch_size=5))
    assert _unsigned(data.ack_set) == [0b11101]          # set bits: still unacknowledged
    assert data.batch_size == 5


def test_ack_sets_of_large_batches_span_words():
    data = _ack_id(MessageId(1, 1, batch_index=64, batch_size=70))
    assert _unsigned(data.ack_set) == [2**64 - 1, 0b111110]
    data = _ack_id(MessageId(1, 1, batch_index=63, batch_size=64))
    assert _unsigned(data.ack_set) == [2**63 - 1]


def test_cumulative_ack_inside_a_batch_stops_at_the_entry_before():
    assert _cumulative_target(MessageId(2, 5, batch_index=1, batch_size=3)).entryId == 4
    assert _cumulative_target(MessageId(2, 5, batch_index=2, batch_size=3)).entryId == 5
    assert _cumulative_target(MessageId(2, 5)).entryId == 5
    assert _cumulative_target(MessageId(2, 0, batch_index=0, batch_size=3)) is None
