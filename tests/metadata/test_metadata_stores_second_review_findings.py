"""Findings of the second metadata-store review (watches, sessions, backends alike)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from pyengine.metadata import MetadataStoreError, NotificationType
from pyengine.metadata.etcd_store import _op_put
from pyengine.metadata.keys import encode_index_key

BIG = 1_100_000          # per record: under etcd's request limit; four exceed a 4 MiB gRPC message


async def test_a_watch_catches_up_on_more_than_a_grpc_message_of_changes(store):
    """A watch opened from an earlier revision (or resumed after a disconnection) gets the
    changes it missed from etcd in one reply of up to 1000 revisions. Once they exceeded
    gRPC's default 4 MiB receive limit, the client dropped the watch stream: the watch
    reconnected from the same revision, failed again, and never delivered anything (every
    other watch of the store lost its stream each time too). The local stores delivered."""
    page = await store.list_prefix("/w/")
    written = [await store.put(f"/w/{i}", bytes([i]) * BIG) for i in range(4)]
    watch = await store.watch("/w/", prefix=True, since=page.revision)
    try:
        got = [await watch.next(10) for _ in written]
    except TimeoutError:
        pytest.fail("the watch delivered nothing of the changes it had to catch up on")
    finally:
        watch.close()
    assert [(n.type, n.path, n.revision, n.value) for n in got] == [
        (NotificationType.CREATED, r.path, r.mod_revision, r.value) for r in written]


@pytest.fixture
async def etcd_store(etcd_server):
    from pyengine.metadata.etcd_store import EtcdMetadataStore

    store = await EtcdMetadataStore(etcd_server.host, etcd_server.port, root=f"/unreadable-{uuid.uuid4().hex[:8]}").start()
    yield store
    await store.close()


# a key or value under the store's root that no pyengine store wrote (another tool, a corrupt
# write): each is not a record the store can read
UNREADABLE = [("/w/not-ours", b"\x07foreign"), ("/w/cut-short", b"\x01\x00"),
              ("/w/bad-partition-key", b"\x01\x00\x01\xff\x00\x00"), (b"/w/\xff", b"\x01\xff\xff\x00\x00")]


@pytest.mark.parametrize("path, raw", UNREADABLE, ids=["foreign", "cut-short", "bad-utf8", "bad-key"])
async def test_a_watch_meeting_an_unreadable_record_fails(etcd_store, path, raw):
    """The etcd watch pump took a record it could not decode for a broken stream: it logged,
    reconnected from the same revision, failed on the same record again, for good. The watch
    delivered nothing more (not even the records written after it) and its consumer never
    learnt why. It now fails with a MetadataStoreError, as a read of that record does."""
    store = etcd_store
    key = store._r + (path if isinstance(path, bytes) else path.encode())
    watch = await store.watch("/w/", prefix=True)
    await store._txn([], [_op_put(key, raw)])
    await store.put("/w/after", b"ok")
    with pytest.raises(MetadataStoreError):
        await watch.next(10)
    assert watch.closed


@pytest.mark.parametrize("path, raw", UNREADABLE, ids=["foreign", "cut-short", "bad-utf8", "bad-key"])
async def test_reading_an_unreadable_record_raises_a_store_error(etcd_store, path, raw):
    """A read of a record cut short or holding bytes that are not UTF-8 raised struct.error or
    UnicodeDecodeError out of the store, where callers catch MetadataStoreError."""
    store = etcd_store
    key = store._r + (path if isinstance(path, bytes) else path.encode())
    await store._txn([], [_op_put(key, raw)])
    if isinstance(path, str):
        with pytest.raises(MetadataStoreError):
            await store.get(path)
    with pytest.raises(MetadataStoreError):
        await store.list_prefix("/w/")
    if isinstance(path, bytes):
        with pytest.raises(MetadataStoreError):
            await store.get_children("/w")


async def test_a_range_watch_meeting_an_unreadable_index_entry_fails(etcd_store):
    """The same for a range watch: an index entry it cannot decode, or whose record is missing
    at the entry's revision, held it retrying for good."""
    store = etcd_store
    store.declare_index("by-value", "/w/", lambda record: record.value.decode())
    watch = await store.range_watch("by-value")
    base = store._i + b"by-value\x00"
    await store._txn([], [_op_put(base + encode_index_key("k") + b"/w/missing", b"")])
    await store.put("/w/after", b"ok")
    with pytest.raises(MetadataStoreError):
        await watch.next(10)
    watch2 = await store.range_watch("by-value")
    await store._txn([], [_op_put(base + b"\x30unterminated", b"")])
    with pytest.raises(MetadataStoreError):
        await watch2.next(10)


def _ipv6_loopback() -> bool:
    import socket

    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
        return True
    except OSError:
        return False


async def test_an_ipv6_etcd_address_goes_to_grpc_in_brackets(monkeypatch):
    """`EtcdMetadataStore("::1", PORT)` handed gRPC `::1:PORT`, which it cannot resolve
    ("Misformatted domain name"). Checked without an etcd, so it runs on any machine."""
    from pyengine.metadata import etcd_store

    given = []

    class Refused(Exception):
        pass

    def client(host, port, **kwargs):
        given.append((host, port))
        raise Refused

    monkeypatch.setattr(etcd_store.aetcd, "Client", client)
    for host, expected in (("::1", "[::1]"), ("[::1]", "[::1]"), ("127.0.0.1", "127.0.0.1")):
        with pytest.raises(Refused):
            await etcd_store.EtcdMetadataStore(host, 2379)._start()
        assert given[-1] == (expected, 2379)


@pytest.mark.skipif(not _ipv6_loopback(), reason="this machine has no IPv6 loopback (::1) to run an etcd on; "
                    "test_an_ipv6_etcd_address_goes_to_grpc_in_brackets checks the address without one")
async def test_an_etcd_store_at_an_ipv6_address(tmp_path):
    """`--metadata-store etcd://[::1]:PORT` (or `EtcdMetadataStore("::1", PORT)`) never
    connected: the address went to gRPC unbracketed, as `::1:PORT`, which it cannot resolve
    ("Misformatted domain name")."""
    from pyengine.metadata import open_metadata_store
    from pyengine.metadata.etcd_server import LocalEtcd

    class DualStackEtcd(LocalEtcd):
        def command(self) -> list[str]:
            command = super().command()
            at = command.index("--listen-client-urls") + 1
            command[at] += f",http://[::1]:{self.port}"
            return command

    etcd = DualStackEtcd(tmp_path / "etcd")
    etcd.start()
    try:
        store = await open_metadata_store(f"etcd://[::1]:{etcd.port}")
        try:
            assert (await store.put("/v6", b"ok")).version == 0
            assert (await store.get("/v6")).value == b"ok"
        finally:
            await store.close()
    finally:
        etcd.stop()


async def test_a_watch_opened_while_the_store_closes_is_refused(etcd_server):
    """A watch whose etcd watch was created while the store closed (after `close()` had
    closed the store's watches and cancelled their pumps) was returned open: nothing would
    ever close it, and its pump, on the closed client, delivered nothing, for good. It is
    refused now, as a session created while the store closes is."""
    from pyengine.metadata.etcd_store import EtcdMetadataStore

    store = await EtcdMetadataStore(etcd_server.host, etcd_server.port, root=f"/closing-{uuid.uuid4().hex[:8]}").start()
    created, go_on = asyncio.Event(), asyncio.Event()
    watch_of = store.client.watch

    async def slow_watch(*args, **kwargs):
        etcd_watch = await watch_of(*args, **kwargs)
        created.set()
        await go_on.wait()          # its reply "arrives" once the store is closed
        return etcd_watch

    store.client.watch = slow_watch
    opening = asyncio.ensure_future(store.watch("/k"))
    await asyncio.wait_for(created.wait(), 10)
    await store.close()
    go_on.set()
    try:
        with pytest.raises(MetadataStoreError):
            watch = await asyncio.wait_for(opening, 10)
            watch.close()
    finally:
        assert not store._pumps, "a watch pump outlived its closed store"
