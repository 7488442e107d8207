"""Stateful property test: random new / add / commit / abort / concurrent ends / participant
failures / clock moves (timeouts, retention) / restarts (also in the middle of an end) against
the reference model. After every step: each txn's status (or not-found), the OPEN txns'
partitions and subscriptions, each coordinator's low watermark, and that every participant of
an ended txn was told its outcome (at least once, confirmed) and never the other action."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, precondition, rule

from pyengine.errors import ServiceNotReadyError
from pyengine.transaction import TxnAction, TxnStatus
from pyengine_kernels import TxnId
from tests.transaction.coordinator.fakes import FakeClock, RecordingParticipants
from tests.transaction.coordinator.helpers import ServiceHarness
from tests.transaction.coordinator.reference_model import ReferenceCoordinator

NUM_COORDINATORS = 2
RETENTION_MS = 3_000
TOPICS = ["t0", "t1", "t2"]
SUBSCRIPTIONS = [("t0", "s"), ("t1", "s"), ("t1", "s2")]

actions = st.sampled_from([TxnAction.COMMIT, TxnAction.ABORT])


class CoordinatorMachine(RuleBasedStateMachine):
    txns = Bundle("txns")

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="coordinator-model-"))
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock()
        self.participants = RecordingParticipants()
        self.harness = ServiceHarness(self.tmp / "data", self.participants, self.clock, sync=False,
                                      num_coordinators=NUM_COORDINATORS, finished_retention_ms=RETENTION_MS)
        self.model = ReferenceCoordinator(NUM_COORDINATORS, RETENTION_MS)
        self.run(self.harness.start())

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    @property
    def service(self):
        return self.harness.service

    def teardown(self) -> None:
        try:
            self.run(self.harness.stop())
        finally:
            self.loop.close()
            shutil.rmtree(self.tmp, ignore_errors=True)

    async def _outcome(self, coro):
        try:
            return await coro
        except Exception as exc:     # compared by class with the model's answer
            return type(exc)

    # --- rules ----------------------------------------------------------------------------

    @rule(target=txns, cid=st.integers(0, NUM_COORDINATORS - 1), timeout_ms=st.integers(1, 5_000))
    def new_txn(self, cid, timeout_ms):
        txn = self.run(self.service.new_transaction(cid, timeout_ms))
        assert txn == self.model.new(cid, timeout_ms, self.clock())
        return txn

    @rule(txn=txns, topics=st.lists(st.sampled_from(TOPICS), max_size=3))
    def add_partitions(self, txn, topics):
        got = self.run(self._outcome(self.service.add_produced_partitions(txn, topics)))
        assert got == self.model.add(txn, topics, True, self.clock())

    @rule(txn=txns, subs=st.lists(st.sampled_from(SUBSCRIPTIONS), max_size=2))
    def add_subscriptions(self, txn, subs):
        got = self.run(self._outcome(self.service.add_acked_subscriptions(txn, subs)))
        assert got == self.model.add(txn, subs, False, self.clock())

    @rule(txn=txns, action=actions)
    def end(self, txn, action):
        got = self.run(self._outcome(self.service.end_transaction(txn, action)))
        assert got == self.model.end(txn, action, self.clock())

    @rule(txn=txns, first=actions, second=actions)
    def end_twice_at_once(self, txn, first, second):
        async def both():
            return await asyncio.gather(self._outcome(self.service.end_transaction(txn, first)),
                                        self._outcome(self.service.end_transaction(txn, second)))

        got = self.run(both())
        expected_first = self.model.end(txn, first, self.clock())
        assert got == [expected_first, self.model.end(txn, second, self.clock())]

    @rule(txn=st.builds(TxnId, st.integers(0, NUM_COORDINATORS - 1), st.integers(0, 40)), action=actions)
    def end_any_id(self, txn, action):
        """Ids never handed out, or long forgotten."""
        got = self.run(self._outcome(self.service.end_transaction(txn, action)))
        assert got == self.model.end(txn, action, self.clock())

    @rule(target_index=st.integers(0, len(TOPICS) + len(SUBSCRIPTIONS) - 1), failures=st.integers(1, 3))
    def participant_fails(self, target_index, failures):
        target = (TOPICS + SUBSCRIPTIONS)[target_index]
        self.participants.fail(target, *[ConnectionError("transient")] * failures)

    @rule(ms=st.sampled_from([1, 10, 500, 1_000, 2_999, 3_000, 5_000]))
    def advance_clock(self, ms):
        self.clock.advance(ms)

        async def expire():
            self.service.poll_timeouts()
            await self.service.wait_for_endings()

        self.run(expire())
        self.model.expire(self.clock())

    @rule()
    def restart(self):
        self.run(self.harness.restart())
        self.run(self.service.wait_for_endings())
        self.model.expire(self.clock())

    @precondition(lambda self: any(t.status == TxnStatus.OPEN for t in self.model.txns.values()))
    @rule(data=st.data(), action=actions)
    def restart_in_the_middle_of_an_end(self, data, action):
        open_txns = sorted(t.txn for t in self.model.txns.values() if t.status == TxnStatus.OPEN)
        txn = data.draw(st.sampled_from(open_txns))
        meta = self.service.get(txn)
        targets = [*meta.partitions, *meta.subscriptions]
        release = self.participants.block(targets[0]) if targets else None

        async def end_then_die():
            ending = asyncio.ensure_future(self.service.end_transaction(txn, action))
            await asyncio.sleep(0.005)
            await self.harness.stop()
            if release is not None:
                release.set()
            return await self._outcome(ending)

        got = self.run(end_then_die())
        expected = self.model.end(txn, action, self.clock())
        assert got in (expected, ServiceNotReadyError)
        self.run(self.harness.start())
        self.run(self.service.wait_for_endings())

    # --- invariants -----------------------------------------------------------------------

    @invariant()
    def statuses_match(self):
        now = self.clock()
        for txn, t in self.model.txns.items():
            expected = self.model.status(txn, now)
            try:
                meta = self.service.get(txn)
            except Exception as exc:
                assert type(exc) is expected, (txn, exc, expected)
                continue
            assert meta.status == expected, (txn, meta.status, expected)
            if meta.status == TxnStatus.OPEN:
                assert (meta.partitions, meta.subscriptions) == (t.partitions, t.subscriptions)

    @invariant()
    def low_watermarks_match(self):
        for cid in range(NUM_COORDINATORS):
            assert self.service.store(cid).low_watermark() == self.model.low_watermark(cid)

    @invariant()
    def participants_heard_exactly_the_outcome(self):
        for txn, t in self.model.txns.items():
            calls = self.participants.calls_for(txn)
            if not t.status.is_terminal:
                assert calls == []
                continue
            outcome = t.status.outcome
            assert {c.action for c in calls} <= {outcome}, (txn, calls)
            confirmed = {c.target for c in calls if c.confirmed}
            assert confirmed == {*t.partitions, *t.subscriptions}, (txn, confirmed)


CoordinatorMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
TestCoordinatorModel = CoordinatorMachine.TestCase
