"""Producer access modes (PIP-68), per topic, as Apache's broker enforces them.

* Shared (the default): any number of producers, unless an exclusive producer holds the topic
  or waits for it (ProducerBusy).
* Exclusive: only when no other producer is attached; else ProducerFenced.
* ExclusiveWithFencing: takes the topic, fencing (disconnecting) every other producer.
* WaitForExclusive: queued until the topic is free (PRODUCER_SUCCESS with producer_ready=false
  first, then a second one when it gets the topic).

Each exclusive grant bumps the topic's epoch; a reconnecting exclusive producer presents the
epoch it was granted (CommandProducer.topic_epoch) and is fenced if a newer grant exists. The
epoch is kept with the topic (its ledger's TOPIC_EPOCH_PROPERTY, as Pulsar's
`pulsar.topic.epoch`): the caller stores each grant before answering, and passes the stored one
when the topic's state is created, so that a restart cannot let an older producer back in.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from pyengine.errors import ProducerBusyError, ProducerFencedError
from pyengine.protocol.pulsar_api_pb2 import ProducerAccessMode

SHARED = ProducerAccessMode.Shared
EXCLUSIVE = ProducerAccessMode.Exclusive
WAIT_FOR_EXCLUSIVE = ProducerAccessMode.WaitForExclusive
EXCLUSIVE_WITH_FENCING = ProducerAccessMode.ExclusiveWithFencing
TOPIC_EPOCH_PROPERTY = "pulsar.topic.epoch"      # the managed-ledger property Pulsar keeps it in


@dataclass
class _TopicAccess:
    epoch: int = 0
    exclusive_holder: object | None = None       # the key of the producer holding the topic
    shared: set[object] = field(default_factory=set)
    waiting: deque[tuple[object, asyncio.Future[int]]] = field(default_factory=deque)


class ProducerAccessModes:
    """Who may produce to which topic. Keys are opaque (one per attached producer)."""

    def __init__(self) -> None:
        self._topics: dict[str, _TopicAccess] = {}

    def acquire(self, topic: str, key: object, mode: int, topic_epoch: int | None,
                fence: Callable[[object], None], stored_epoch: int = 0) -> int | asyncio.Future[int] | None:
        """Grant `key` access: None for a shared producer, the topic epoch for an exclusive
        one, or a future of it when the producer must wait (WaitForExclusive). `fence(key)` is
        called for each producer an ExclusiveWithFencing grant pushes out. `stored_epoch`: the
        topic's stored epoch (used when no producer is on the topic). Raises
        ProducerBusyError / ProducerFencedError."""
        state = self._topics.get(topic)
        if state is None:
            state = self._topics[topic] = _TopicAccess(epoch=stored_epoch)
        if topic_epoch is not None and topic_epoch < state.epoch:
            raise ProducerFencedError(f"topic {topic} was taken by a newer exclusive producer "
                                      f"(epoch {state.epoch} > {topic_epoch})")
        if mode == SHARED:
            if state.exclusive_holder is not None or state.waiting:
                raise ProducerBusyError(f"topic {topic} has an exclusive producer")
            state.shared.add(key)
            return None
        busy = state.exclusive_holder is not None or bool(state.shared)
        if mode == EXCLUSIVE:
            if state.exclusive_holder is not None:
                raise ProducerFencedError(f"topic {topic} has an existing exclusive producer")
            if state.shared:
                raise ProducerFencedError(f"topic {topic} has existing shared producers")
            return self._grant(state, key, topic_epoch)
        if mode == EXCLUSIVE_WITH_FENCING:
            others = ([state.exclusive_holder] if state.exclusive_holder is not None else []) + list(state.shared)
            state.exclusive_holder = None
            state.shared.clear()
            # As Pulsar's incrementTopicEpochIfNeeded: the producers waiting for the topic are
            # fenced out too, or the next of them would take it once this one leaves.
            waiting, state.waiting = state.waiting, deque()
            for other in others:
                fence(other)
            for _, waiter in waiting:
                if not waiter.done():
                    waiter.set_exception(ProducerFencedError(f"Fenced out: topic {topic} was taken by an "
                                                             "ExclusiveWithFencing producer"))
            return self._grant(state, key, None)
        if mode == WAIT_FOR_EXCLUSIVE:
            if not busy and not state.waiting:
                return self._grant(state, key, topic_epoch)
            waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            state.waiting.append((key, waiter))
            return waiter
        raise ProducerBusyError(f"unknown producer access mode {mode}")

    @staticmethod
    def _grant(state: _TopicAccess, key: object, topic_epoch: int | None) -> int:
        # As Pulsar: a producer presenting an epoch (never below the topic's: it would have
        # been fenced) takes it; any other grant is a new one.
        state.exclusive_holder = key
        state.epoch = topic_epoch if topic_epoch is not None else state.epoch + 1
        return state.epoch

    def release(self, topic: str, key: object) -> None:
        """`key` left the topic (closed, disconnected, fenced, or gave up waiting)."""
        state = self._topics.get(topic)
        if state is None:
            return
        state.shared.discard(key)
        if any(k is key for k, _ in state.waiting):
            kept: deque[tuple[object, asyncio.Future[int]]] = deque()
            for waiting_key, waiter in state.waiting:
                if waiting_key is not key:
                    kept.append((waiting_key, waiter))
                elif not waiter.done():
                    # Its creation waits on this: end it (or it waits for ever, and so does
                    # the broker's shutdown, which waits for every request being handled).
                    waiter.set_exception(ProducerBusyError(f"stopped waiting for exclusive access to {topic}"))
                    waiter.exception()          # retrieved: its creation may be gone already
            state.waiting = kept
        if state.exclusive_holder is key:
            state.exclusive_holder = None
        if state.exclusive_holder is None and not state.shared:
            while state.waiting:
                waiting_key, waiter = state.waiting.popleft()
                if not waiter.done():
                    waiter.set_result(self._grant(state, waiting_key, None))
                    break
        if state.exclusive_holder is None and not state.shared and not state.waiting:
            del self._topics[topic]             # its epoch is stored with the topic
