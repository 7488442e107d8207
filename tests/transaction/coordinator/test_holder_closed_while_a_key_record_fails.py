"""A connect (or a delete) whose record cannot be written leaves the key as it was, its holder
included. Found by an audit: the holder was put back from a copy taken before the write, so a
holder whose connection closed while the write was under way (its release then found another
holder and did nothing) was put back after it closed: the key stayed "connected" to a closed
connection, kept in memory, until its next connect."""

from __future__ import annotations

import asyncio

import pytest

from pyengine.transaction.coordinator.keys import ANONYMOUS
from tests.transaction.coordinator.test_keys import Holder, connect, harness  # noqa: F401

KEY = "k"


def failing_write(keys, monkeypatch) -> tuple[asyncio.Event, asyncio.Event]:
    """The key's next record write waits for the first event (the second is set once it
    waits), then fails."""
    started, release = asyncio.Event(), asyncio.Event()

    async def persist(state):
        started.set()
        await release.wait()
        raise OSError("no space left on device")
    monkeypatch.setattr(keys, "_persist", persist)
    return release, started


@pytest.mark.parametrize("change", ["connect", "delete"])
async def test_a_holder_closed_during_a_failed_write_is_not_put_back(harness, monkeypatch, change):
    service = harness.service
    keys = service.keys
    holder = Holder()
    await connect(service, KEY, holder=holder)
    persist = keys._persist
    release, started = failing_write(keys, monkeypatch)
    pending = asyncio.ensure_future(connect(service, KEY) if change == "connect" else keys.delete(ANONYMOUS, KEY))
    await started.wait()
    keys.disconnected(ANONYMOUS, KEY, holder)          # the holder's connection closes meanwhile
    release.set()
    with pytest.raises(OSError):
        await pending
    monkeypatch.setattr(keys, "_persist", persist)
    state = keys.find(ANONYMOUS, KEY)
    assert state.epoch == 0                            # nothing of the failed change stays
    assert state.holder is None and not keys.info(state).connected


async def test_a_holder_still_connected_after_a_failed_write_keeps_the_key(harness, monkeypatch):
    service = harness.service
    keys = service.keys
    holder = Holder()
    await connect(service, KEY, holder=holder)
    release, _ = failing_write(keys, monkeypatch)
    release.set()
    for change in (connect(service, KEY), keys.delete(ANONYMOUS, KEY)):
        with pytest.raises(OSError):
            await change
    state = keys.find(ANONYMOUS, KEY)
    assert state.holder is holder and not holder.closed and keys.info(state).connected
