"""How acknowledgements are put on the wire."""

from hypothesis import given
from hypothesis import strategies as st

from pyengine.client.consumer import _ack_id, _cumulative_target, _cumulative_target_with_ack_set
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
    assert _cumulative_target(MessageId(2, 0, batch_index=0, batch_size=3)).entryId == (1 << 64) - 1   # (2, -1)


@given(st.integers(1, 200).flatmap(lambda size: st.tuples(st.just(size), st.integers(-1, size - 1))))
def test_a_transactional_cumulative_ack_names_its_entry_with_the_later_indexes_left_free(batch):
    size, index = batch
    data = _cumulative_target_with_ack_set(MessageId(4, 9, batch_index=index, batch_size=size if index >= 0 else 0))
    assert (data.ledgerId, data.entryId) == (4, 9)
    free = {w * 64 + bit for w, word in enumerate(_unsigned(data.ack_set)) for bit in range(64) if word >> bit & 1}
    if index < 0 or index == size - 1:            # a whole entry: no ack set
        assert not data.ack_set and not data.HasField("batch_size")
    else:
        assert free == set(range(index + 1, size)) and data.batch_size == size
