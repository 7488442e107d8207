"""Garbage-collector settings for the long-running processes pyengine starts itself
(`pyengine serve`, `pyengine perf`); an embedding application owns its own collector."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

# Collections of the youngest generation once per this many new container objects (CPython's
# default is 700). A broker (or a load generator) allocates a few short-lived objects per
# message (frames, futures, callbacks): at 700 it would collect every ~100 messages and
# promote live in-flight objects, whose older-generation collections walk every long-lived
# object on the heap and stall the event loop.
GC_YOUNG_THRESHOLD = 50_000


@contextlib.contextmanager
def settled_garbage_collector() -> Iterator[None]:
    """After start-up: move everything loaded so far (modules, recovered state) out of the
    collector's sight (`gc.freeze`), and collect the young generation less often; as before
    on exit (the commands also run inside other programs, e.g. tests)."""
    threshold = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()
