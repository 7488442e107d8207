"""Stateful property test: the handle against a small reference model.

The model knows, for every message (entry, batch index), whether it is free, acknowledged on
the cursor, or reserved by an open transaction (individually, or under the one pending
cumulative ack). Random individual / batch / cumulative transactional acks (cumulative ones
also up to a message inside a batch) by several transactions, plain cursor acks, commits,
aborts and restarts (close the environment, reopen it, a new cursor and handle, replay) run
against both; after every step the handle's answers and the cursor's state must be the model's.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Awaitable, Callable

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pyengine.errors import TransactionConflictError
from pyengine.storage import StorageEnvironment
from pyengine.transaction.pendingack import IndividualAck
from pyengine_kernels import TxnId, ackset_acked_indexes
from tests.transaction.pendingack.helpers import FAILOVER, acking, open_subscription

SLOTS = 3          # transactions open at a time


class Model:
    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes
        self.acked: list[set[int]] = [set() for _ in sizes]
        self.reserved: list[dict[int, TxnId]] = [{} for _ in sizes]
        self.cumulative: tuple[TxnId, int] | None = None

    def all_indexes(self, entry: int) -> set[int]:
        return set(range(self.sizes[entry]))

    def fully_acked(self, entry: int) -> bool:
        return self.acked[entry] == self.all_indexes(entry)

    def mark_delete(self) -> int:
        """The last entry of the fully acknowledged prefix (-1: none)."""
        entry = -1
        while entry + 1 < len(self.sizes) and self.fully_acked(entry + 1):
            entry += 1
        return entry

    def under_cumulative(self, entry: int, txn: TxnId | None = None) -> bool:
        """Covered by the pending cumulative ack (of a txn other than `txn`, if given)."""
        return (self.cumulative is not None and entry <= self.cumulative[1]
                and (txn is None or self.cumulative[0] != txn))

    def individual_conflict(self, txn: TxnId, request: list[tuple[int, set[int]]]) -> bool:
        taken: dict[int, set[int]] = {}
        for entry, indexes in request:
            if self.fully_acked(entry) or indexes & self.acked[entry]:
                return True
            if indexes & set(self.reserved[entry]) or indexes & taken.get(entry, set()):
                return True
            if self.under_cumulative(entry, txn):
                return True
            taken.setdefault(entry, set()).update(indexes)
        return False

    def cumulative_conflict(self, txn: TxnId, entry: int) -> bool:
        mark_delete = self.mark_delete()
        if entry <= mark_delete:
            return True
        if self.cumulative is not None and (self.cumulative[0] != txn or entry <= self.cumulative[1]):
            return True
        return any(holder != txn for held in self.reserved[mark_delete + 1:entry + 1] for holder in held.values())

    def acks_of(self, txn: TxnId) -> list[int]:
        """What commit/abort return: the entries reserved individually, then the cumulative one."""
        entries = [entry for entry, held in enumerate(self.reserved) if txn in held.values()]
        if self.cumulative is not None and self.cumulative[0] == txn:
            entries.append(self.cumulative[1])
        return entries

    def end(self, txn: TxnId, commit: bool) -> None:
        for entry, held in enumerate(self.reserved):
            mine = {index for index, holder in held.items() if holder == txn}
            for index in mine:
                del held[index]
            if commit:
                self.acked[entry] |= mine
        if self.cumulative is not None and self.cumulative[0] == txn:
            if commit:
                self.ack_cumulative(self.cumulative[1])
            self.cumulative = None

    def ack_cumulative(self, entry: int) -> None:
        for covered in range(entry + 1):
            self.acked[covered] = self.all_indexes(covered)

    def fully_pending(self, entry: int) -> bool:
        taken = self.acked[entry] | set(self.reserved[entry])
        return self.under_cumulative(entry) or taken == self.all_indexes(entry)

    def pending_ack_set(self, entry: int) -> list[int] | None:
        if self.under_cumulative(entry):
            return []
        if not self.reserved[entry]:
            return None
        return acking(self.sizes[entry], *(self.acked[entry] | set(self.reserved[entry])))


async def _inside_loop(write: Callable[[], Awaitable[None]]) -> None:
    """Cursor acks return a future of the running loop: create it there."""
    await write()


def index_sets(size: int) -> st.SearchStrategy[set[int] | None]:
    """None: the whole entry; otherwise the batch indexes of one ack."""
    indexes = st.integers(0, size - 1)
    return st.none() | st.sets(indexes, min_size=1, max_size=2) | st.sets(indexes, min_size=1)


class PendingAckMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.dir = tempfile.mkdtemp(prefix="pending-ack-model-")
        self.env: StorageEnvironment | None = None
        self.txns = [TxnId(1, least) for least in range(SLOTS)]
        self.ended: list[TxnId] = []

    def run(self, coroutine):
        return self.loop.run_until_complete(coroutine)

    @initialize(sizes=st.lists(st.sampled_from([1, 2, 3, 5, 70]), min_size=2, max_size=6))
    def open(self, sizes: list[int]) -> None:
        self.model = Model(sizes)
        self.env = StorageEnvironment(self.dir, sync=False)
        self.sub = self.run(open_subscription(self.env, len(sizes), per_ledger=3, sub_type=FAILOVER))
        self.positions = self.sub.positions
        assert len(self.positions) == len(sizes)

    def teardown(self) -> None:
        if self.env is not None:
            self.run(self.env.drain())
            self.env.close()
        self.loop.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # --- transactional acks ---------------------------------------------------------------

    @rule(data=st.data(), slot=st.integers(0, SLOTS - 1))
    def individual_ack(self, data: st.DataObject, slot: int) -> None:
        txn = self.txns[slot]
        entries = data.draw(st.lists(st.integers(0, len(self.positions) - 1), min_size=1, max_size=3))
        request, acks = [], []
        for entry in entries:
            size = self.model.sizes[entry]
            indexes = data.draw(index_sets(size))
            if indexes is None:
                request.append((entry, self.model.all_indexes(entry)))
                acks.append(IndividualAck(self.positions[entry], size))
            else:
                request.append((entry, indexes))
                acks.append(IndividualAck(self.positions[entry], size, tuple(acking(size, *indexes))))
        expect_conflict = self.model.individual_conflict(txn, request)
        try:
            self.run(self.sub.handle.individual_ack(txn, acks))
        except TransactionConflictError:
            assert expect_conflict, f"unexpected conflict for {txn} {request}"
            return
        assert not expect_conflict, f"missed conflict for {txn} {request}"
        for entry, indexes in request:
            for index in indexes:
                self.model.reserved[entry][index] = txn

    @rule(data=st.data(), slot=st.integers(0, SLOTS - 1))
    def cumulative_ack(self, data: st.DataObject, slot: int) -> None:
        txn = self.txns[slot]
        entry = data.draw(st.integers(0, len(self.positions) - 1))
        expect_conflict = self.model.cumulative_conflict(txn, entry)
        try:
            self.run(self.sub.handle.cumulative_ack(txn, self.positions[entry]))
        except TransactionConflictError:
            assert expect_conflict, f"unexpected conflict for {txn} up to {entry}"
            return
        assert not expect_conflict, f"missed conflict for {txn} up to {entry}"
        self.model.cumulative = (txn, entry)

    @rule(data=st.data(), slot=st.integers(0, SLOTS - 1))
    def cumulative_ack_in_batch(self, data: st.DataObject, slot: int) -> None:
        """Up to a message inside a batch: the entries before it cumulatively, and indexes of
        the batch individually; one request, applied whole or not at all."""
        txn = self.txns[slot]
        entry = data.draw(st.integers(1, len(self.positions) - 1))
        size = self.model.sizes[entry]
        indexes = data.draw(st.sets(st.integers(0, size - 1), min_size=1))
        expect_conflict = (self.model.cumulative_conflict(txn, entry - 1)
                           or self.model.individual_conflict(txn, [(entry, indexes)]))
        ack = IndividualAck(self.positions[entry], size, tuple(acking(size, *indexes)))
        try:
            self.run(self.sub.handle.cumulative_ack_in_batch(txn, self.positions[entry - 1], ack))
        except TransactionConflictError:
            assert expect_conflict, f"unexpected conflict for {txn} up to {entry}:{sorted(indexes)}"
            return
        assert not expect_conflict, f"missed conflict for {txn} up to {entry}:{sorted(indexes)}"
        self.model.cumulative = (txn, entry - 1)
        for index in indexes:
            self.model.reserved[entry][index] = txn

    # --- ends -----------------------------------------------------------------------------

    @rule(slot=st.integers(0, SLOTS - 1), commit=st.booleans())
    def end(self, slot: int, commit: bool) -> None:
        txn = self.txns[slot]
        expected = [self.positions[entry] for entry in self.model.acks_of(txn)]
        handle = self.sub.handle
        returned = self.run(handle.commit(txn, -1) if commit else handle.abort(txn, -1))
        assert returned == expected
        self.model.end(txn, commit)
        self.ended.append(txn)
        self.txns[slot] = TxnId(1, SLOTS + len(self.ended))

    @precondition(lambda self: self.ended)
    @rule(data=st.data(), commit=st.booleans())
    def end_again(self, data: st.DataObject, commit: bool) -> None:
        txn = data.draw(st.sampled_from(self.ended))
        handle = self.sub.handle
        assert self.run(handle.commit(txn, -1) if commit else handle.abort(txn, -1)) == []

    # --- plain acks and restarts ----------------------------------------------------------

    @rule(data=st.data())
    def plain_ack(self, data: st.DataObject) -> None:
        """A consumer's ack without a transaction, of messages no transaction holds (the
        subscription drops plain acks of pending messages before they reach the cursor)."""
        entry = data.draw(st.integers(0, len(self.positions) - 1))
        size = self.model.sizes[entry]
        indexes = data.draw(st.sets(st.integers(0, size - 1), min_size=1))
        if indexes & set(self.model.reserved[entry]) or self.model.under_cumulative(entry):
            return
        cursor, position = self.sub.cursor, self.positions[entry]
        self.run(_inside_loop(lambda: cursor.ack_batch_indexes(position, acking(size, *indexes), size)))
        self.model.acked[entry] |= indexes

    @rule(data=st.data())
    def plain_cumulative_ack(self, data: st.DataObject) -> None:
        entry = data.draw(st.integers(0, len(self.positions) - 1))
        if self.model.cumulative is not None or any(self.model.reserved[:entry + 1]):
            return
        cursor = self.sub.cursor
        self.run(_inside_loop(lambda: cursor.ack_cumulative(self.positions[entry])))
        self.model.ack_cumulative(entry)

    @rule()
    def restart(self) -> None:
        self.run(self.env.drain())
        self.env.close()
        self.env = StorageEnvironment(self.dir, sync=False)
        self.sub = self.run(open_subscription(self.env, sub_type=FAILOVER, replay_chunk=2))
        assert self.sub.positions == self.positions

    # --- the answers ----------------------------------------------------------------------

    @invariant()
    def handle_and_cursor_agree_with_the_model(self) -> None:
        if self.env is None:
            return
        handle, cursor = self.sub.handle, self.sub.cursor
        for entry, position in enumerate(self.positions):
            size = self.model.sizes[entry]
            assert handle.is_fully_pending(position, size) == self.model.fully_pending(entry), entry
            assert handle.pending_ack_set(position) == self.model.pending_ack_set(entry), entry
            assert cursor.is_acked(position) == self.model.fully_acked(entry), entry
            if not cursor.is_acked(position):
                words = cursor.batch_ack_set(position)
                acked = set() if words is None else set(ackset_acked_indexes(words, size))
                assert acked == self.model.acked[entry], entry
        model_cumulative = self.model.cumulative
        assert handle.cumulative_ack_of_txn == (
            None if model_cumulative is None else (model_cumulative[0], self.positions[model_cumulative[1]]))


PendingAckMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TestPendingAckModel = PendingAckMachine.TestCase
