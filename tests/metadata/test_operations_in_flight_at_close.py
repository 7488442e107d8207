"""An operation in flight when its store closes completes or fails with `MetadataStoreError`
(the store is closed), on every backend; it never ends as if its caller had been cancelled.
Found by an audit: on etcd, closing the store closes the gRPC channel, which cancels the calls
in flight, and their `asyncio.CancelledError` reached the callers, whose tasks then ended as
cancelled although nobody cancelled them (and a caller handling `MetadataStoreError` did not
catch it). A real cancellation of the calling task must still propagate as `CancelledError`."""

from __future__ import annotations

import asyncio

import pytest

from aetcd import rpc

from pyengine.metadata import MetadataStoreError, Session, Watch


def _operations(store):
    return {
        "get": lambda: store.get("/k"),
        "put": lambda: store.put("/k", b"1"),
        "create": lambda: store.create("/new", b"1"),
        "delete": lambda: store.delete("/gone"),
        "list_prefix": lambda: store.list_prefix("/"),
        "get_children": lambda: store.get_children("/"),
        "watch": lambda: store.watch("/k"),
        "create_session": lambda: store.create_session(5.0),
    }


async def _release(result):
    if isinstance(result, Watch):
        result.close()
    elif isinstance(result, Session):
        result.abandon()            # created as the store closed: not a test of that here


async def test_operations_in_flight_when_the_store_closes(store):
    await store.put("/k", b"0")
    await store.put("/gone", b"0")
    tasks = {name: asyncio.ensure_future(op()) for name, op in _operations(store).items()}
    await asyncio.sleep(0)                  # every one of them is in flight
    await store.close()
    await asyncio.wait(tasks.values(), timeout=10)
    outcomes = {}
    for name, task in tasks.items():
        assert task.done(), f"{name} still running after the store closed"
        if task.cancelled():
            outcomes[name] = "cancelled"
        elif task.exception() is not None:
            outcomes[name] = type(task.exception()).__name__
            assert isinstance(task.exception(), MetadataStoreError), (name, task.exception())
        else:
            outcomes[name] = "ok"
            await _release(task.result())
    assert "cancelled" not in outcomes.values(), outcomes


@pytest.mark.parametrize("operation", ["get", "put", "list_prefix", "watch", "create_session"])
async def test_a_cancelled_caller_is_still_cancelled(store, operation):
    await store.put("/k", b"0")
    task = asyncio.ensure_future(_operations(store)[operation]())
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.wait([task], timeout=10)
    if task.cancelled():
        return
    # completed before the cancellation reached it (a local store): that is all right too
    await _release(task.result())


@pytest.mark.parametrize("backend_name", ["etcd"])
async def test_etcd_tells_a_cancelled_caller_from_a_call_cancelled_under_it(store):
    """The calling task cancelled while its call waits: `CancelledError`. The call cancelled
    by gRPC itself (what closing the channel does), the caller not: `MetadataStoreError`."""
    request = rpc.RangeRequest(key=store._rkey("/k"))
    waiting = asyncio.Event()

    async def slow(*args, **kwargs):
        waiting.set()
        await asyncio.sleep(10)

    task = asyncio.ensure_future(store._rpc(slow, request, "read"))
    await asyncio.wait_for(waiting.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()

    async def cancelled_by_grpc(*args, **kwargs):
        raise asyncio.CancelledError()

    with pytest.raises(MetadataStoreError):
        await store._rpc(cancelled_by_grpc, request, "read")
    assert asyncio.current_task().cancelling() == 0
