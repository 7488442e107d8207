"""Failover: the consumers of the highest priority are ordered by name as Pulsar's
pickAndScheduleActiveConsumer orders them, with Java's String.compareTo: by UTF-16 code units.
Found by an audit: Python's code-point order put a name starting with U+FF01 before one starting
with U+1F600, whose surrogate pair (D83D DE00) Java sorts first, so another consumer was active."""

from __future__ import annotations

from pyengine.broker import Broker
from pyengine.broker.dispatcher import java_string_order

FULLWIDTH, EMOJI = "\uff01x", "\U0001F600x"


def test_names_sort_by_utf16_code_units():
    assert sorted([FULLWIDTH, EMOJI]) == [FULLWIDTH, EMOJI]                       # code points
    assert sorted([FULLWIDTH, EMOJI], key=java_string_order) == [EMOJI, FULLWIDTH]
    assert sorted(["b", "ab", "a"], key=java_string_order) == ["a", "ab", "b"]    # a prefix first


async def test_partition_zero_goes_to_the_name_java_sorts_first(tmp_path):
    topic = "persistent://public/default/java-order-partition-0"
    # The pick is under test, not the handover delay: none.
    async with Broker.embedded(tmp_path, sync=False, active_consumer_failover_delay_time_ms=0) as broker:
        fullwidth = await broker.subscribe(topic, "s", consumer_type="failover", consumer_name=FULLWIDTH)
        emoji = await broker.subscribe(topic, "s", consumer_type="failover", consumer_name=EMOJI)
        assert emoji.active and not fullwidth.active
