"""Which transaction design serves what, in one broker (PIP-473 "Configuration").

* Participants, per topic: `segment://` topics use v5 (metadata-driven buffer and pending
  acks), every other domain v4 (markers in the stream, pending-ack log). A namespace's
  `transaction_version` policy (4 or 5) overrides the default for its topics — for migration
  and debugging — first loaded after it is set: a topic keeps the design of its first load
  (pinned in its properties, `BrokerService.pin_transaction_version`), as each design reads
  only its own transaction state.
* Coordinators, per transaction: v4 ids are 0..N-1 (what a Pulsar client discovers through the
  coordinators' assign topic); the v5 coordinator has the id `V5_COORDINATOR_ID`, which only a
  v5 client asks for (pyengine.client does for scalable topics). `CoordinatorRouter` is what
  the rest of the broker calls `service.coordinator`: it sends each request to the coordinator
  of its id, and otherwise behaves as the v4 service (admin, lookups, stats).
* `V5Transactions`: the broker's v5 components over its metadata store — the header cache (one
  watch for all participants), the coordinator, the metrics.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from pyengine.errors import NotAllowedError, ServiceNotReadyError, TransactionCoordinatorNotFoundError
from pyengine.metadata import MetadataStore
from pyengine.naming import TopicName
from pyengine.transaction import TxnAction, TxnStatus
from pyengine.transaction.buffer.metadata_buffer import MetadataTransactionBuffer
from pyengine.transaction.coordinator.clock import Clock
from pyengine.transaction.coordinator.metadata_coordinator import MetadataTransactionCoordinator
from pyengine.transaction.coordinator.metadata_headers import TxnHeaderCache
from pyengine.transaction.coordinator.metadata_metrics import V5Metrics
from pyengine.transaction.coordinator.metadata_records import V5_COORDINATOR_ID, declare_indexes
from pyengine.transaction.coordinator.service import TransactionCoordinatorService
from pyengine.transaction.coordinator.stats import Counters
from pyengine.transaction.coordinator.validation import check_txn
from pyengine.transaction.outcome import mark_retrieved
from pyengine_kernels import TxnId


def default_transaction_version(topic: TopicName) -> int:
    return 5 if topic.domain == "segment" else 4


def check_txn_design(buffer: object, txn: TxnId, topic: str) -> None:
    """A v5 txn on a topic served by v4 would never end there (the v5 coordinator tells no
    participant), and a v4 txn on a v5 topic neither (v5 topics take no markers): refused."""
    v5_buffer = isinstance(buffer, MetadataTransactionBuffer)
    if txn.most_bits == V5_COORDINATOR_ID and not v5_buffer:
        raise NotAllowedError(f"{topic} takes v4 transactions only; {txn} is a v5 (scalable-topic) transaction")
    if txn.most_bits != V5_COORDINATOR_ID and v5_buffer:
        raise NotAllowedError(f"{topic} takes v5 (metadata-driven) transactions only; {txn} is a v4 transaction")


def append_condition(txn: TxnId, registration: asyncio.Future[Any] | None) -> asyncio.Future[Any] | None:
    """What a transactional append (or pending-ack record) must be written with or after: the
    registration of its partition (subscription), while a v4 coordinator is still writing it
    to the topics' storage environment (a v5 registration is a metadata-store write, which the
    topic's storage cannot order)."""
    if registration is None or registration.done() or txn.most_bits == V5_COORDINATOR_ID:
        return None
    return registration


class V5Transactions:
    def __init__(self, store: MetadataStore, *, clock: Clock, retention_ms: int, sweep_interval_ms: int,
                 recheck_interval_s: float) -> None:
        self.store = store
        self.metrics = V5Metrics()
        self.headers = TxnHeaderCache(store, clock=clock, recheck_interval_s=recheck_interval_s)
        self.coordinator = MetadataTransactionCoordinator(store, clock=clock, retention_ms=retention_ms,
                                                          sweep_interval_ms=sweep_interval_ms, metrics=self.metrics)

    async def start(self) -> None:
        declare_indexes(self.store)
        await self.headers.start()
        await self.coordinator.start()

    async def close(self) -> None:
        await self.coordinator.close()
        await self.headers.close()


class CoordinatorRouter:
    """v4 service + v5 coordinator behind the v4 service's interface."""

    def __init__(self, v4: TransactionCoordinatorService, v5: MetadataTransactionCoordinator) -> None:
        self.v4 = v4
        self.v5 = v5

    def __getattr__(self, name: str) -> Any:        # admin, lookups, stats: the v4 service's
        return getattr(self.v4, name)

    @property
    def counters(self) -> Counters:
        """Both designs' counters together: the broker's transaction figures."""
        return Counters.total([self.v4.counters] + ([self.v5.counters] if self.v5 is not None else []))

    @property
    def coordinator_ids(self) -> list[int]:
        """The v4 coordinators (what Pulsar clients discover); v5 is asked for by id."""
        return self.v4.coordinator_ids

    def serves(self, coordinator_id: int) -> bool:
        return coordinator_id in self.v4.coordinator_ids or (self.v5 is not None and self.v5.serves(coordinator_id))

    def _for(self, txn: TxnId) -> Any:
        if check_txn(txn).most_bits != V5_COORDINATOR_ID:
            return self.v4
        if self.v5 is None:
            raise ServiceNotReadyError("the v5 transaction coordinator is not started")
        return self.v5

    async def new_transaction(self, coordinator_id: int, timeout_ms: int) -> TxnId:
        if coordinator_id == V5_COORDINATOR_ID:
            if self.v5 is None:
                raise ServiceNotReadyError("the v5 transaction coordinator is not started")
            return await self.v5.new_transaction(coordinator_id, timeout_ms)
        return await self.v4.new_transaction(coordinator_id, timeout_ms)

    def register_produced_partitions(self, txn: TxnId, partitions: list[str]) -> asyncio.Future[Any]:
        return self._for(txn).register_produced_partitions(txn, partitions)

    def register_acked_subscriptions(self, txn: TxnId, subscriptions: list[tuple[str, str]]) -> asyncio.Future[Any]:
        return self._for(txn).register_acked_subscriptions(txn, subscriptions)

    def partition_registered(self, txn: TxnId, partition: str) -> bool:
        """See TransactionCoordinatorService.partition_registered (v4 only: False for v5)."""
        return txn.most_bits != V5_COORDINATOR_ID and self.v4.partition_registered(txn, partition)

    def add_produced_partitions_now(self, txn: TxnId, partitions: list[str]) -> Awaitable[None] | None:
        """ADD_PARTITION_TO_TXN: None when it may be answered now, else what to await first.
        A v4 answer does not wait for the record to be durable, only queued: the
        coordinators' log shares the topics' storage environment, whose group commits are
        written in order, and every transactional append of this broker is written with or
        after its partition's registration, failing if that failed (`append_condition`). So
        no message can be durable without its registration, and a producer's first send of a
        txn does not wait a group commit for it (Apache's broker answers after the log
        write). v5 writes to the metadata store: awaited."""
        coordinator = self._for(txn)
        if coordinator is self.v4:
            coordinator.register_produced_partitions(txn, partitions).add_done_callback(mark_retrieved)
            return None
        return coordinator.add_produced_partitions(txn, partitions)

    def add_acked_subscriptions_now(self, txn: TxnId, subscriptions: list[tuple[str, str]]) -> Awaitable[None] | None:
        """ADD_SUBSCRIPTION_TO_TXN, answered as `add_produced_partitions_now` is: a
        transactional ack's pending-ack record is written with or after its subscription's
        registration."""
        coordinator = self._for(txn)
        if coordinator is self.v4:
            coordinator.register_acked_subscriptions(txn, subscriptions).add_done_callback(mark_retrieved)
            return None
        return coordinator.add_acked_subscriptions(txn, subscriptions)

    async def end_transaction(self, txn: TxnId, action: TxnAction, *, check_epoch: bool = True) -> TxnStatus:
        if check_txn(txn).most_bits == V5_COORDINATOR_ID:
            return await self._for(txn).end_transaction(txn, action)
        # check_epoch: transaction keys are v4's (the admin's force-abort turns the check off)
        return await self.v4.end_transaction(txn, action, check_epoch=check_epoch)

    def get(self, txn: TxnId):
        if check_txn(txn).most_bits == V5_COORDINATOR_ID:
            raise TransactionCoordinatorNotFoundError(
                f"{txn} is a v5 transaction: its state is the header /txn/<txnId> in the metadata store "
                "(service.coordinator.v5.get)")
        return self.v4.get(txn)

