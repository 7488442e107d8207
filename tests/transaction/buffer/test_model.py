"""Random interleavings of everything a topic's transaction buffer sees, checked after every
step against the pure-Python model in reference_model.py: plain and transactional appends
(several txns of several coordinators), commits, aborts, coordinator timeouts whose end never
reaches the topic, retried and conflicting end requests, low watermarks (fresh and stale),
snapshots, ledger trimming, and restarts (clean, or as after a crash: no final snapshot)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pyengine.errors import InvalidTxnStatusError, NotAllowedError
from pyengine.storage import ManagedLedger, ManagedLedgerConfig, StorageEnvironment
from pyengine.transaction.buffer.config import TopicTransactionBufferConfig
from pyengine.transaction.buffer.topic_buffer import TXN_PROPERTY, TopicTransactionBuffer
from pyengine_kernels import Position, TxnId
from tests.transaction.buffer.helpers import TOPIC, visible_positions
from tests.transaction.buffer.reference_model import Status, TopicModel

LEDGER_CONFIG = ManagedLedgerConfig(max_entries_per_ledger=3)     # trimmed by the `trim` rule only
# Segments of 2 aborts: snapshots seal, list and (with trims) delete segments all the time.
BUFFER_CONFIG = TopicTransactionBufferConfig(snapshot_max_txn_count=3, snapshot_min_interval_ms=3_600_000,
                                             replay_chunk_entries=2, snapshot_segment_aborts=2)
COORDINATORS = st.sampled_from([1, 2])
OUTCOMES = {"commit": Status.COMMITTED, "abort": Status.ABORTED}


def pos(position: Position) -> tuple[int, int]:
    return (position.ledger_id, position.entry_id)


class TransactionBufferMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.dir = tempfile.mkdtemp(prefix="tb-model-")
        self.model = TopicModel()
        self.env: StorageEnvironment | None = None
        self._open()

    def run(self, awaitable):
        return self.loop.run_until_complete(awaitable)

    def _open(self) -> None:
        self.env = StorageEnvironment(self.dir, sync=False)     # the process never dies here

        async def start():
            ledger = await ManagedLedger.open(self.env, TOPIC, LEDGER_CONFIG)
            cursor = await ledger.open_cursor("sub", "earliest")
            buffer = TopicTransactionBuffer(ledger, BUFFER_CONFIG)
            await buffer.recover()
            return ledger, cursor, buffer

        self.ledger, self.cursor, self.buffer = self.run(start())

    def teardown(self) -> None:
        async def stop():
            await self.buffer.close()
            await self.ledger.close()
            await self.env.drain()

        try:
            self.run(stop())
        finally:
            self.env.close()
            self.loop.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    # --- txns -----------------------------------------------------------------------------

    def txns(self, *coordinator: Status, topic_known: bool = False) -> list[tuple[int, int]]:
        return sorted(t for t, s in self.model.coordinator.items()
                      if s in coordinator and (not topic_known or self.model.topic.get(t, Status.OPEN)
                                               is not Status.OPEN))

    @rule(coordinator_id=COORDINATORS)
    def new_txn(self, coordinator_id: int) -> None:
        self.model.new_txn(coordinator_id)

    # --- appends --------------------------------------------------------------------------

    @rule(count=st.integers(1, 3))
    def plain_append(self, count: int) -> None:
        async def append():
            return await asyncio.gather(*(self.ledger.append(b"plain") for _ in range(count)))

        for position in self.run(append()):
            self.model.append(pos(position), None)

    @precondition(lambda self: self.model.coordinator)
    @rule(data=st.data(), count=st.integers(1, 2))
    def txn_append(self, data, count: int) -> None:
        """Mostly txns still open at their coordinator; sometimes a late write of one it ended."""
        txn = data.draw(st.sampled_from(sorted(self.model.coordinator)))
        refused = self.model.append_refused(txn)

        async def append():
            return await asyncio.gather(*(self.buffer.append(TxnId(*txn), b"txn") for _ in range(count)),
                                        return_exceptions=True)

        for result in self.run(append()):
            if refused:
                assert isinstance(result, NotAllowedError), result
            else:
                assert isinstance(result, Position), result
                self.model.append(pos(result), txn)

    # --- ends -----------------------------------------------------------------------------

    def _end(self, txn: tuple[int, int], outcome: str, stale: bool) -> None:
        low_watermark = -1 if stale else self.model.coordinator_low_watermark(txn[0])
        self.model.coordinator[txn] = OUTCOMES[outcome]
        self.run(getattr(self.buffer, outcome)(TxnId(*txn), low_watermark))
        self.model.end_on_topic(txn, OUTCOMES[outcome], low_watermark)

    @precondition(lambda self: self.txns(Status.OPEN))
    @rule(data=st.data(), outcome=st.sampled_from(sorted(OUTCOMES)), stale=st.booleans())
    def end(self, data, outcome: str, stale: bool) -> None:
        self._end(data.draw(st.sampled_from(self.txns(Status.OPEN))), outcome, stale)

    @precondition(lambda self: self.txns(Status.OPEN))
    @rule(data=st.data())
    def coordinator_times_out(self, data) -> None:
        """The coordinator aborts a txn and its request to this topic is lost."""
        self.model.coordinator[data.draw(st.sampled_from(self.txns(Status.OPEN)))] = Status.ABORTED

    @precondition(lambda self: self.txns(Status.COMMITTED, Status.ABORTED))
    @rule(data=st.data(), stale=st.booleans())
    def retried_end(self, data, stale: bool) -> None:
        """The coordinator repeats an end (after its own restart, or a lost response), or
        delivers at last the abort of a txn that timed out."""
        txn = data.draw(st.sampled_from(self.txns(Status.COMMITTED, Status.ABORTED)))
        self._end(txn, "commit" if self.model.coordinator[txn] is Status.COMMITTED else "abort", stale)

    @precondition(lambda self: self.txns(Status.COMMITTED, Status.ABORTED, topic_known=True))
    @rule(data=st.data())
    def conflicting_end(self, data) -> None:
        txn = data.draw(st.sampled_from(self.txns(Status.COMMITTED, Status.ABORTED, topic_known=True)))
        wrong = "abort" if self.model.topic[txn] is Status.COMMITTED else "commit"
        low_watermark = self.model.coordinator_low_watermark(txn[0])
        try:
            self.run(getattr(self.buffer, wrong)(TxnId(*txn), low_watermark))
        except InvalidTxnStatusError:
            return
        # Only a txn whose outcome the topic no longer needs to remember may be let through.
        assert txn[1] <= self.model.topic_low_watermark(txn[0]), f"{wrong} of {txn} was accepted"
        self.model.apply_low_watermark(txn[0], low_watermark)

    # --- snapshots, trimming, restarts ----------------------------------------------------

    @rule()
    def snapshot(self) -> None:
        self.run(self.buffer.take_snapshot())

    @rule()
    def trim(self) -> None:
        async def trim():
            horizon = self.buffer.max_read_position()      # consumers never read past it
            if horizon.entry_id >= 0:
                await self.cursor.ack_cumulative(horizon)
            self.ledger.set_retention(0, -1)
            await self.ledger.trim(now_ms=1 << 62)          # every consumed ledger
            self.ledger.set_retention(-1, -1)

        self.run(trim())
        self.model.trim_before(pos(self.ledger.first_position()))

    @rule(clean=st.booleans())
    def restart(self, clean: bool) -> None:
        async def stop():
            if clean:
                await self.buffer.close()
            await self.ledger.close()
            await self.env.drain()

        self.run(stop())
        self.env.close()
        self._open()
        recovered = self.buffer.stats()["low_watermarks"]
        for coordinator_id, low_watermark in self.model.low_watermarks.items():
            # A clean stop snapshots the watermarks (of a topic that ever held txn entries or
            # markers: another has nothing to protect); a crash may lose the latest ones.
            if clean and TXN_PROPERTY in self.ledger.properties:
                assert recovered.get(coordinator_id, -1) == low_watermark
            else:
                assert recovered.get(coordinator_id, -1) <= low_watermark
        self.model.low_watermarks = dict(recovered)

    # --- the check ------------------------------------------------------------------------

    @invariant()
    def same_view_as_the_model(self) -> None:
        assert self.buffer.max_read_position() <= self.ledger.lac
        assert {(t.most_bits, t.least_bits): pos(p) for t, p in self.buffer.ongoing_txns()} == self.model.open_txns()
        assert {pos(p) for p in visible_positions(self.ledger, self.buffer)} == self.model.visible()


TransactionBufferMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestTransactionBufferMachine = TransactionBufferMachine.TestCase
