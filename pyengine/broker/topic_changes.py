"""The requests that create, delete or change a topic run one at a time per topic name (the
admin API's, and a lookup that creates a partitioned topic: auto topic creation).

Each of them checks the stored state, then awaits its writes (a topic's load, its partitions,
its deletion): two of them at once both passed their checks and left what neither allows. A
plain topic and a partitioned topic under one name (both 204), a partition created or added
while its partitioned topic was deleted (left behind without it), a topic-level policy stored
after its topic's deletion was written (inherited by a topic created again under the name).
A partition shares its partitioned topic's turn: `<topic>-partition-<n>` is checked against it.

A namespace is deleted once the changes of its topics under way are done: a topic being
created is not stored yet, so the namespace looked empty and the topic was left in a deleted
namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator

from pyengine.broker.service import BrokerService
from pyengine.naming import TopicName

# service -> partitioned topic name -> [lock, holders and waiters]
_LOCKS: weakref.WeakKeyDictionary[BrokerService, dict[str, list]] = weakref.WeakKeyDictionary()


@contextlib.asynccontextmanager
async def topic_change(service: BrokerService, name: TopicName) -> AsyncIterator[None]:
    """Hold the turn of `name` (of its partitioned topic, for a partition)."""
    locks = _LOCKS.setdefault(service, {})
    key = str(name.partitioned_topic)
    entry = locks.setdefault(key, [asyncio.Lock(), 0])
    entry[1] += 1
    try:
        async with entry[0]:
            yield
    finally:
        entry[1] -= 1
        if entry[1] == 0 and locks.get(key) is entry:
            del locks[key]           # nobody holds or waits for it: no lock kept per name ever used


async def namespace_settled(service: BrokerService, namespace: str) -> None:
    """Wait until no change of a topic of `namespace` is under way. The caller then checks and
    deletes in the same event-loop turn, so that no change starts in between."""
    locks = _LOCKS.get(service, {})
    while busy := [entry[0] for key, entry in locks.items() if TopicName.parse(key).namespace_name == namespace]:
        for lock in busy:
            async with lock:
                pass
