"""HeldMessages: the spans a transactional cumulative ack of an Exclusive/Failover consumer is
checked against (see pyengine/client/held.py)."""

from hypothesis import given
from hypothesis import strategies as st

from pyengine.client.held import HeldMessages
from pyengine.client.message import MessageId


def mid(entry: int, index: int = -1) -> MessageId:
    return MessageId(1, entry, index)


def test_nothing_is_stale_until_the_stream_comes_again():
    held = HeldMessages()
    for entry in range(3):
        held.handed_out(mid(entry))
    assert not held.covers_stale(mid(5))
    held.sent_again()
    assert held.handed is None
    assert held.covers_stale(mid(0))            # refused: the span it covers is settled
    assert held.covers_stale(mid(2))            # 1 and 2 are still stale
    assert held.stale is None and not held.covers_stale(mid(9))


def test_a_cumulative_ack_settles_what_it_covers():
    held = HeldMessages()
    for entry in range(4):
        held.handed_out(mid(entry))
    held.sent_again()
    held.covered_up_to(mid(1))                  # a plain cumulative ack: 0 and 1 settled
    assert not held.covers_stale(mid(1))
    assert held.covers_stale(mid(2))


def test_inside_a_batch_the_index_counts():
    held = HeldMessages()
    for index in range(4):
        held.handed_out(mid(7, index))
    held.sent_again()
    held.covered_up_to(mid(7, 1))
    assert not held.covers_stale(mid(7, 1))
    assert held.covers_stale(mid(7, 2))


@given(st.lists(st.tuples(st.sampled_from(["take", "again", "ack", "check"]), st.integers(0, 30)), max_size=60))
def test_against_a_model_of_in_order_handing(steps):
    """Messages are handed out in order (entry numbers increasing, as an Exclusive/Failover
    consumer takes them); the model keeps the set of stale ones and of handed ones."""
    held, handed, stale, next_entry = HeldMessages(), set(), set(), 0
    for action, n in steps:
        if action == "take":
            held.handed_out(mid(next_entry))
            handed.add(next_entry)
            next_entry += 1
        elif action == "again":
            held.sent_again()
            stale |= handed
            handed.clear()
        elif action == "ack":
            held.covered_up_to(mid(n))
            handed = {e for e in handed if e > n}
            stale = {e for e in stale if e > n}
        else:
            expected = any(e <= n for e in stale)
            assert held.covers_stale(mid(n)) == expected
            if expected:
                handed = {e for e in handed if e > n}
                stale = {e for e in stale if e > n}
