"""The segment DAG against a reference model of active ranges (hypothesis state machine), the
spec's JSON format, key hashing and malformed metadata."""

import json

import mmh3
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pyengine.scalable import HashRange, LayoutError, SegmentLayout, SegmentState, key_hash

SPEC_EXAMPLE = """{
  "epoch": 3, "nextSegmentId": 5,
  "segments": {
    "0": {"segmentId": 0, "hashRange": {"start": 0, "end": 65535}, "state": "SEALED", "parentIds": [],
          "childIds": [1, 2], "createdAtEpoch": 0, "sealedAtEpoch": 1},
    "1": {"segmentId": 1, "hashRange": {"start": 0, "end": 32767}, "state": "SEALED", "parentIds": [0],
          "childIds": [3, 4], "createdAtEpoch": 1, "sealedAtEpoch": 3},
    "2": {"segmentId": 2, "hashRange": {"start": 32768, "end": 65535}, "state": "ACTIVE", "parentIds": [0],
          "childIds": [], "createdAtEpoch": 1, "sealedAtEpoch": 0},
    "3": {"segmentId": 3, "hashRange": {"start": 0, "end": 16383}, "state": "ACTIVE", "parentIds": [1],
          "childIds": [], "createdAtEpoch": 3, "sealedAtEpoch": 0},
    "4": {"segmentId": 4, "hashRange": {"start": 16384, "end": 32767}, "state": "ACTIVE", "parentIds": [1],
          "childIds": [], "createdAtEpoch": 3, "sealedAtEpoch": 0}
  },
  "properties": {}
}"""


def test_the_spec_example_round_trips():
    layout = SegmentLayout.from_metadata(SPEC_EXAMPLE.encode())
    assert layout.epoch == 3 and layout.next_segment_id == 5
    assert [s.segment_id for s in layout.active_segments] == [3, 4, 2]
    assert layout.to_metadata() == json.loads(SPEC_EXAMPLE)
    assert layout.find_active_segment(16383).segment_id == 3
    assert layout.find_active_segment(16384).segment_id == 4
    assert layout.find_active_segment(0xFFFF).segment_id == 2
    assert [s.segment_id for s in layout.lineage(3)] == [0, 1, 3]
    assert [s.segment_id for s in layout.lineage(0)] == [0, 1, 3, 4, 2]


def test_split_at_the_midpoint_and_merge_adjacent():
    layout = SegmentLayout.initial(1).split_segment(0)
    assert [(s.hash_range.start, s.hash_range.end) for s in layout.active_segments] == [(0, 32767), (32768, 65535)]
    assert layout.segment(0).state is SegmentState.SEALED and layout.segment(0).sealed_at_epoch == 1
    merged = layout.merge_segments(2, 1)
    assert merged.segment(3).hash_range == HashRange.full() and merged.segment(3).parent_ids == (2, 1)
    assert merged.epoch == 2 and merged.next_segment_id == 4
    assert [s.segment_id for s in merged.lineage(3)] == [0, 2, 1, 3]      # shared ancestor 0 once


def test_initial_layouts_divide_the_space_evenly():
    for n in (1, 2, 3, 7, 16):
        layout = SegmentLayout.initial(n)
        layout.check()
        sizes = [s.hash_range.end - s.hash_range.start + 1 for s in layout.active_segments]
        assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 65536
    for bad in (0, -1, 65537, "2", 1.5, True):
        with pytest.raises(LayoutError):
            SegmentLayout.initial(bad)


def test_invalid_operations_are_refused_and_change_nothing():
    layout = SegmentLayout.initial(4).split_segment(0)
    before = layout.to_metadata()
    for op in (lambda: layout.split_segment(0),           # sealed
               lambda: layout.split_segment(99),          # unknown
               lambda: layout.merge_segments(1, 3),       # not adjacent
               lambda: layout.merge_segments(1, 1),
               lambda: layout.merge_segments(0, 1),       # sealed
               lambda: layout.prune_segment(1),           # active
               lambda: layout.find_active_segment(65536),
               lambda: layout.find_active_segment(-1)):
        with pytest.raises(LayoutError):
            op()
    assert layout.to_metadata() == before
    one_wide = SegmentLayout.from_metadata({"epoch": 0, "nextSegmentId": 2, "segments": {
        "0": {"segmentId": 0, "hashRange": {"start": 0, "end": 0}, "state": "ACTIVE"},
        "1": {"segmentId": 1, "hashRange": {"start": 1, "end": 65535}, "state": "ACTIVE"}}})
    with pytest.raises(LayoutError, match="one value wide"):
        one_wide.split_segment(0)


def test_a_segment_id_that_is_a_bool_is_refused():
    """True looked up (and split) segment 1, False segment 0: a Python caller's mistake."""
    layout = SegmentLayout.initial(2)
    for op in (lambda: layout.split_segment(True), lambda: layout.merge_segments(False, True),
               lambda: layout.segment(True)):
        with pytest.raises(TypeError, match="segment id must be an int"):
            op()


def _meta(**changes):
    raw = json.loads(SPEC_EXAMPLE)
    for path, value in changes.items():
        target = raw
        *parents, last = path.split("__")
        for part in parents:
            target = target[part]
        target[last] = value
    return raw


@pytest.mark.parametrize("bad", [
    b"not json", b"[]", {"segments": []}, {"epoch": 1, "segments": {}},
    _meta(epoch=-1), _meta(epoch="3"), _meta(nextSegmentId=4),
    _meta(segments__3__state="OPEN"), _meta(segments__3__segmentId=9),
    _meta(segments__3__hashRange={"start": 0, "end": 70000}),
    _meta(segments__3__hashRange={"start": 1, "end": 16383}),       # hole at 0
    _meta(segments__4__hashRange={"start": 16000, "end": 32767}),   # overlap
    _meta(segments__3__parentIds=[2]),                                # one-way link
    _meta(segments__2__childIds=[4]),
    _meta(segments__1__sealedAtEpoch=0),
    _meta(segments__3__createdAtEpoch=9),
    _meta(segments__3__parentIds="1"), _meta(properties={"a": 1}),
    _meta(segments__3__hashRange=None), _meta(segments__3__segmentId=True),
])
def test_malformed_metadata_is_refused(bad):
    with pytest.raises(LayoutError):
        SegmentLayout.from_metadata(json.dumps(bad).encode() if isinstance(bad, dict) else bad)


def test_key_hash_is_pulsars_murmur3_modulo_65536():
    # Pulsar's Murmur3_32Hash: murmur3 x86 32-bit, seed 0, & Integer.MAX_VALUE; then % 65536.
    for key in ("", "a", "key-1", "ключ", "x" * 1000):
        assert key_hash(key) == (mmh3.hash(key.encode(), 0, signed=False) & 0x7FFFFFFF) % 65536
        assert key_hash(key.encode()) == key_hash(key)
    assert 0 <= key_hash("anything") <= 0xFFFF


class LayoutMachine(RuleBasedStateMachine):
    """The reference model: active ranges as {id: (start, end)}, sealed ids, parent links."""

    def __init__(self):
        super().__init__()
        self.layout = SegmentLayout.initial(1)
        self.active = {0: (0, 0xFFFF)}
        self.sealed: set[int] = set()
        self.parents = {0: set()}
        self.next_id = 1
        self.epoch = 0

    def _step(self, new_layout):
        old, old_json = self.layout, self.layout.to_metadata()
        self.layout = new_layout
        assert old.to_metadata() == old_json                 # the old snapshot is untouched
        self.epoch += 1

    @rule(data=st.data())
    def split(self, data):
        sid = data.draw(st.sampled_from(sorted(self.active)))
        start, end = self.active[sid]
        if start == end:
            with pytest.raises(LayoutError):
                self.layout.split_segment(sid)
            return
        self._step(self.layout.split_segment(sid))
        mid = start + (end - start) // 2
        del self.active[sid]
        self.sealed.add(sid)
        self.active[self.next_id], self.active[self.next_id + 1] = (start, mid), (mid + 1, end)
        self.parents[self.next_id] = {sid}
        self.parents[self.next_id + 1] = {sid}
        self.next_id += 2

    @precondition(lambda self: len(self.active) > 1)
    @rule(data=st.data())
    def merge(self, data):
        ordered = sorted(self.active, key=lambda i: self.active[i][0])
        i = data.draw(st.integers(0, len(ordered) - 2))
        a, b = ordered[i], ordered[i + 1]
        if data.draw(st.booleans()):
            a, b = b, a
        self._step(self.layout.merge_segments(a, b))
        self.active[self.next_id] = (min(self.active[a][0], self.active[b][0]),
                                     max(self.active[a][1], self.active[b][1]))
        del self.active[a], self.active[b]
        self.sealed |= {a, b}
        self.parents[self.next_id] = {a, b}
        self.next_id += 1

    @precondition(lambda self: len(self.active) > 2)
    @rule(data=st.data())
    def merge_non_adjacent_is_refused(self, data):
        ordered = sorted(self.active, key=lambda i: self.active[i][0])
        i = data.draw(st.integers(0, len(ordered) - 3))
        with pytest.raises(LayoutError):
            self.layout.merge_segments(ordered[i], ordered[i + 2])

    @precondition(lambda self: self.sealed)
    @rule(data=st.data())
    def prune(self, data):
        sid = data.draw(st.sampled_from(sorted(self.sealed)))
        self._step(self.layout.prune_segment(sid))
        self.sealed.discard(sid)
        del self.parents[sid]
        for links in self.parents.values():
            links.discard(sid)

    @rule(hashes=st.lists(st.integers(0, 0xFFFF), min_size=1, max_size=20))
    def route(self, hashes):
        for h in hashes:
            expected = [i for i, (s, e) in self.active.items() if s <= h <= e]
            assert [self.layout.find_active_segment(h).segment_id] == expected

    @invariant()
    def matches_the_model(self):
        layout = self.layout
        assert layout.epoch == self.epoch and layout.next_segment_id == self.next_id
        assert {s.segment_id: (s.hash_range.start, s.hash_range.end) for s in layout.active_segments} == self.active
        assert set(layout.all_segments) == set(self.active) | self.sealed
        assert {i: set(s.parent_ids) for i, s in layout.all_segments.items()} == self.parents
        for boundary in {s for s, _ in self.active.values()} | {e for _, e in self.active.values()}:
            assert layout.find_active_segment(boundary).hash_range.contains(boundary)
        assert SegmentLayout.from_metadata(layout.to_json_bytes()) == layout
        for sid in layout.all_segments:
            lineage = [s.segment_id for s in layout.lineage(sid)]
            assert len(lineage) == len(set(lineage)) and sid in lineage
            assert set(layout.segment(sid).parent_ids) <= set(lineage)
            assert set(layout.segment(sid).child_ids) & set(layout.all_segments) <= set(lineage)


LayoutMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
test_layout_against_the_model = LayoutMachine.TestCase


@given(st.lists(st.text(max_size=20), min_size=1, max_size=50), st.integers(1, 64))
def test_every_key_routes_to_the_one_active_segment_holding_its_hash(keys, n):
    layout = SegmentLayout.initial(n)
    for key in keys:
        segment = layout.segment_for_key(key)
        assert segment.is_active and segment.hash_range.contains(key_hash(key))


@given(st.integers(1, 40), st.lists(st.text(min_size=1, max_size=8), max_size=12, unique=True))
def test_round_robin_gives_every_active_segment_to_exactly_one_consumer_evenly(segments, consumers):
    from pyengine.scalable.coordinator import round_robin
    layout = SegmentLayout.initial(segments)
    plan = round_robin(layout, consumers)
    assert set(plan) == set(consumers)
    if consumers:
        assigned = [sid for ids in plan.values() for sid in ids]
        assert sorted(assigned) == sorted(s.segment_id for s in layout.active_segments)
        sizes = [len(ids) for ids in plan.values()]
        assert max(sizes) - min(sizes) <= 1
        assert plan == round_robin(layout, list(reversed(consumers)))      # order of arrival is irrelevant
