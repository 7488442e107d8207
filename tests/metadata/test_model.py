"""Property-based conformance: random put / CAS / create / delete / sequential sequences against
a dict-based reference model, on every backend. After every step the records, the prefix
listing and two secondary indexes (full and random sub-ranges) must match the model; at the
end, replaying the range watch and the prefix watch must rebuild the index and the records.

Hypothesis drives a synchronous state machine in a worker thread; each operation runs on the
test's event loop (where the store lives) and the thread waits for it.
"""

from __future__ import annotations

import asyncio
import itertools

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from pyengine.metadata import AlreadyExistsError, BadVersionError, NotFoundError, NotificationType
from pyengine.metadata.keys import encode_index_key

PATHS = ["a", "b", "c", "x/d", "x/e", "x/y/f"]
_examples = itertools.count()


def key_a(record):
    """Ints, strs and (int, bytes) tuples; None for empty values (not indexed)."""
    v = record.value
    if not v:
        return None
    if v[0] < 64:
        return v[0] % 5
    if v[0] < 128:
        return str(v[0] % 3)
    return (v[0] % 2, v[1:2])


def key_b(record):
    return record.path.rsplit("/", 1)[1] + ("!" if len(record.value) % 2 else "")


class Ref:
    """The reference model: path -> (value, version, partition key)."""

    def __init__(self):
        self.records: dict[str, tuple[bytes, int, str | None]] = {}

    def index(self, key_fn, prefix):
        from pyengine.metadata import Record

        entries = []
        for path, (value, version, pk) in self.records.items():
            if not path.startswith(prefix):
                continue
            key = key_fn(Record(path, value, version, 0, 0, None, pk))
            if key is not None:
                entries.append((encode_index_key(key) + path.encode(), path))
        return [path for _, path in sorted(entries)]


async def test_random_operations_match_the_reference_model(store):
    loop = asyncio.get_running_loop()

    def run(coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result(timeout=60)

    class Machine(RuleBasedStateMachine):
        @initialize()
        def setup(self):
            n = next(_examples)
            self.base = f"/m{n}"
            self.idx_a, self.idx_b = f"a{n}", f"b{n}"
            store.declare_index(self.idx_a, self.base + "/", key_a)
            store.declare_index(self.idx_b, self.base + "/x/", key_b)
            self.ref = Ref()
            self.last_seq: dict[str, int] = {}
            self.range_watch = run(store.range_watch(self.idx_a))
            self.prefix_watch = run(store.watch(self.base + "/", prefix=True))

        @rule(path=st.sampled_from(PATHS), value=st.binary(max_size=4),
              mode=st.sampled_from(["any", "create", "right", "wrong"]),
              pk=st.one_of(st.none(), st.sampled_from(["p", "q"])))
        def put(self, path, value, mode, pk):
            full = f"{self.base}/{path}"
            current = self.ref.records.get(full)
            expected = {"any": None, "create": -1,
                        "right": current[1] if current else 0,
                        "wrong": current[1] + 1 if current else 3}[mode]
            should_fail = (mode == "create" and current is not None) or (mode == "right" and current is None) \
                or mode == "wrong"
            try:
                record = run(store.put(full, value, expected, partition_key=pk))
            except BadVersionError as exc:
                assert should_fail, f"unexpected {exc!r}"
                assert isinstance(exc, AlreadyExistsError) == (mode == "create")
                return
            assert not should_fail, f"put {full} {mode} should have failed"
            version = current[1] + 1 if current else 0
            assert (record.path, record.value, record.version, record.partition_key) == (full, value, version, pk)
            self.ref.records[full] = (value, version, pk)

        @rule(path=st.sampled_from(PATHS), mode=st.sampled_from(["any", "right", "wrong"]))
        def delete(self, path, mode):
            full = f"{self.base}/{path}"
            current = self.ref.records.get(full)
            expected = {"any": None, "right": current[1] if current else 0,
                        "wrong": current[1] + 1 if current else 0}[mode]
            try:
                run(store.delete(full, expected))
            except NotFoundError:
                assert current is None
                return
            except BadVersionError:
                assert current is not None and mode == "wrong"
                return
            assert current is not None and mode != "wrong"
            del self.ref.records[full]

        @rule(parent=st.sampled_from(["s/", "x/s-"]), value=st.binary(max_size=4))
        def sequential(self, parent, value):
            record = run(store.put(f"{self.base}/{parent}", value, sequential=True))
            number = int(record.path[-10:])
            assert record.path == f"{self.base}/{parent}{number:010d}" and record.version == 0
            assert number > self.last_seq.get(parent, -1)
            self.last_seq[parent] = number
            self.ref.records[record.path] = (value, 0, None)

        @rule(low=st.integers(0, 6), high=st.integers(0, 6), text=st.sampled_from(["", "0", "1", "2", "3"]))
        def range_query(self, low, high, text):
            bounds = [(low % 5, high % 5 if high < 5 else text), (text, None), (None, (1, b"")), ((0, b"\x80"), None)]
            for start, end in bounds:
                got = [r.path for r in run(store.range_query(self.idx_a, start, end))]
                lo = encode_index_key(start) if start is not None else b""
                hi = encode_index_key(end) if end is not None else None
                want = [p for p in self.ref.index(key_a, self.base + "/")
                        if lo <= encode_index_key(key_a(self._rec(p))) + p.encode()
                        and (hi is None or encode_index_key(key_a(self._rec(p))) + p.encode() < hi)]
                assert got == want, (start, end)

        def _rec(self, path):
            from pyengine.metadata import Record

            value, version, pk = self.ref.records[path]
            return Record(path, value, version, 0, 0, None, pk)

        @invariant()
        def matches_model(self):
            if not hasattr(self, "ref"):
                return
            page = run(store.list_prefix(self.base + "/"))
            assert [r.path for r in page] == sorted(self.ref.records, key=str.encode)
            for r in page:
                assert (r.value, r.version, r.partition_key) == self.ref.records[r.path]
            got_a = [r.path for r in run(store.range_query(self.idx_a))]
            assert got_a == self.ref.index(key_a, self.base + "/")
            got_b = [r.path for r in run(store.range_query(self.idx_b))]
            assert got_b == self.ref.index(key_b, self.base + "/x/")

        def teardown(self):
            if not hasattr(self, "ref"):
                return
            # a sentinel write: once its notifications are in, all earlier ones are
            sentinel = f"{self.base}/zz-sentinel"
            run(store.put(sentinel, b"\x00"))
            self.ref.records[sentinel] = (b"\x00", 0, None)
            index: dict[str, object] = {}
            records: dict[str, tuple[bytes, int]] = {}
            revisions = []
            while True:
                n = run(self.range_watch.next(10))
                revisions.append(n.revision)
                if n.type is NotificationType.DELETED:
                    assert index.pop(n.path) == n.index_key
                else:
                    assert n.type is (NotificationType.MODIFIED if n.path in index else NotificationType.CREATED)
                    assert n.index_key == key_a(n.record)
                    index[n.path] = n.index_key
                if n.path == sentinel:
                    break
            assert revisions == sorted(revisions)
            assert sorted(index, key=lambda p: encode_index_key(index[p]) + p.encode()) == \
                self.ref.index(key_a, self.base + "/")
            while True:
                n = run(self.prefix_watch.next(10))
                if n.type is NotificationType.DELETED:
                    del records[n.path]
                else:
                    assert n.type is (NotificationType.MODIFIED if n.path in records else NotificationType.CREATED)
                    records[n.path] = (n.value, n.version)
                if n.path == sentinel:
                    break
            assert records == {p: (v, ver) for p, (v, ver, _pk) in self.ref.records.items()}
            self.range_watch.close()
            self.prefix_watch.close()

    await loop.run_in_executor(None, lambda: run_state_machine_as_test(
        Machine, settings=settings(max_examples=15, stateful_step_count=25)))
