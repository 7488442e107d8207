"""`pyengine serve` as the DESIGN contract states it: a child process that prints its `ready`
line with the protocol, admin and metrics endpoints, serves them, keeps what it acknowledged
across a SIGTERM restart and exits 0; bad flags and taken ports are clear errors."""

from __future__ import annotations

import contextlib
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from pyengine.broker.policies import Retention
from pyengine.broker.service import BrokerService
from pyengine.cli import main, serve
from pyengine.client import Client
from pyengine.metadata import open_metadata_store
from pyengine.metadata.etcd_server import EtcdUnavailableError, LocalEtcd
from pyengine.testing import ServeProcess, serve_command
from tests.cli.serve_flags import serve_args

TOPIC = "persistent://public/default/serve-contract"


@pytest.fixture
def listening_socket() -> Iterator[socket.socket]:
    """A loopback port that is taken."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock


async def test_serve_announces_serves_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    broker = ServeProcess(tmp_path / "data", "--metadata-store", "lmdb", "--broker-id", "b-7",
                          "--num-coordinators", "2")
    broker.start()
    try:
        assert "pyengine broker b-7 ready:" in broker.ready_line
        assert f"metrics={broker.http_url}/metrics" in broker.ready_line
        async with Client(broker.url) as client:
            producer = await client.create_producer(TOPIC)
            txn = await client.new_transaction()
            await producer.send(b"in-txn", txn=txn)
            await producer.send(b"plain-after")          # waits for the open transaction
            await txn.commit()
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{broker.http_url}/admin/v2/persistent/public/default") as reply:
                assert reply.status == 200
                assert TOPIC in await reply.json()
            async with http.get(f"{broker.http_url}/metrics") as reply:
                assert reply.status == 200
                assert 'pulsar_txn_committed_total{cluster="standalone"} 1.0' in await reply.text()
            async with http.get(f"{broker.http_url}/openapi.json") as reply:
                assert "/admin/v2/tenants" in (await reply.json())["paths"]
    finally:
        code = broker.stop()
    assert code == 0, broker.log_tail()
    assert "stopped" in broker.log_tail()

    broker.start()                                      # same data dir and ports: all is still there
    try:
        async with Client(broker.url) as client:
            consumer = await client.subscribe(TOPIC, "after-restart", initial_position="earliest")
            assert [(await consumer.receive()).data for _ in range(2)] == [b"in-txn", b"plain-after"]
    finally:
        assert broker.stop() == 0


async def test_sigterm_with_clients_attached_still_exits_0_and_keeps_what_was_acknowledged(tmp_path: Path) -> None:
    broker = ServeProcess(tmp_path / "data", "--num-coordinators", "1").start()
    try:
        async with Client(broker.url, operation_timeout_seconds=5) as client:
            producer = await client.create_producer(TOPIC)
            await client.subscribe(TOPIC, "attached", initial_position="earliest")
            await producer.send(b"acknowledged")
            open_txn = await client.new_transaction()
            await producer.send(b"never-committed", txn=open_txn)
            assert broker.stop() == 0, broker.log_tail()      # while all of that is connected
    finally:
        broker.kill()
    broker.start()
    try:
        async with Client(broker.url) as client:
            reader = await client.subscribe(TOPIC, "after", initial_position="earliest")
            assert (await reader.receive(timeout=5)).data == b"acknowledged"
    finally:
        assert broker.stop() == 0


async def test_serve_runs_on_the_memory_metadata_store(tmp_path: Path) -> None:
    broker = ServeProcess(tmp_path / "data", "--metadata-store", "memory", "--num-coordinators", "1").start()
    try:
        async with Client(broker.url) as client:
            producer = await client.create_producer(TOPIC)
            await producer.send(b"x")
    finally:
        assert broker.stop() == 0


async def test_brokers_on_one_etcd_metadata_store_share_it(tmp_path: Path) -> None:
    etcd = LocalEtcd(tmp_path / "etcd")
    try:
        etcd.start()
    except EtcdUnavailableError as exc:
        pytest.fail(f"this test needs a local etcd: {exc}", pytrace=False)
    brokers = [ServeProcess(tmp_path / f"data-{i}", "--metadata-store", etcd.url, "--broker-id", f"b{i}",
                            "--num-coordinators", "1") for i in range(2)]
    try:
        first = brokers[0].start()
        first.admin("PUT", "/admin/v2/scalable/public/default/orders?numInitialSegments=2")
        async with Client(first.url) as client:               # the broker serves as usual meanwhile
            producer = await client.create_producer(TOPIC)
            await producer.send(b"on-etcd")
        second = brokers[1].start()                            # its own data dir, the same store
        assert second.admin("GET", "/admin/v2/scalable/public/default") == ["topic://public/default/orders"]
        assert [broker.stop() for broker in brokers] == [0, 0]
    finally:
        for broker in brokers:
            broker.kill()
        etcd.stop()


@pytest.mark.parametrize(("argv", "complaint"), [
    (["--port", "70000"], "--port: 70000 is not between 0 and 65535"),
    (["--port", "six"], "--port: 'six' is not a port number"),
    (["--http-port", "-1"], "--http-port: -1 is not between 0 and 65535"),
    (["--metadata-store", "zk://127.0.0.1:2181"], "--metadata-store: 'zk://127.0.0.1:2181' is not one of"),
    (["--metadata-store", "etcd://127.0.0.1"], "--metadata-store: 'etcd://127.0.0.1' is not etcd://HOST:PORT"),
    (["--metadata-store", "etcd://:2379"], "is not etcd://HOST:PORT"),
    (["--num-coordinators", "0"], "--num-coordinators: 0 is not at least 1"),
    (["--retention-time-minutes", "-2"], "--retention-time-minutes: -2 is below -1"),
    (["--retention-size-mb", "lots"], "--retention-size-mb: 'lots' is not a whole number"),
    (["--retention-time-minutes", "10", "--retention-size-mb", "0"], "only valid with the other also 0"),
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["--max-message-publish-buffer-size-mb", "0"], "0 is not a buffer size"),
    (["--max-message-publish-buffer-size-mb", "-2"], "-2 is below -1 (-1: no limit)"),
    (["--max-message-publish-buffer-size-mb", "1e3"], "'1e3' is not a whole number"),
])
def test_bad_flags_are_refused_before_anything_starts(tmp_path: Path, capsys, argv: list[str],
                                                      complaint: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--data-dir", str(tmp_path / "data"), *argv])
    assert exit_info.value.code == 2
    assert complaint in capsys.readouterr().err
    assert not (tmp_path / "data").exists()             # nothing was created


def test_the_retention_flags_are_the_brokers_default_policy(tmp_path: Path) -> None:
    args = serve_args("--data-dir", str(tmp_path), "--retention-time-minutes", "30", "--retention-size-mb", "-1")
    assert serve.broker_config(args).retention == Retention(30, -1)
    default = serve.broker_config(serve_args("--data-dir", str(tmp_path)))
    assert default.retention == Retention(-1, -1)          # ours keeps consumed ledgers unless asked


@pytest.mark.parametrize(("flags", "limit"), [((), 512 * 1024 * 1024),
                                              (("--max-message-publish-buffer-size-mb", "64"), 64 * 1024 * 1024),
                                              (("--max-message-publish-buffer-size-mb", "-1"), -1)])
async def test_the_publish_buffer_flag_sets_the_protocol_servers_limit(tmp_path: Path, flags: tuple[str, ...],
                                                                       limit: int) -> None:
    args = serve_args("--data-dir", str(tmp_path), "--port", "0", *flags)
    async with contextlib.AsyncExitStack() as components:
        service = BrokerService(serve.broker_config(args))
        components.push_async_callback(service.close)
        await service.start()
        server = await serve.start_protocol_server(args, service, components, {})
        assert server.max_publish_buffer_bytes == limit


@pytest.mark.parametrize(("flags", "synced"), [((), True), (("--no-fsync",), False)])
def test_group_commits_are_fsynced_unless_no_fsync_is_given(tmp_path: Path, flags: tuple[str, ...],
                                                            synced: bool) -> None:
    broker = BrokerService(serve.broker_config(serve_args("--data-dir", str(tmp_path), *flags)))
    try:
        assert {broker.env._env.flags()[k] for k in ("sync", "metasync")} == {synced}
    finally:
        broker.env.close()


def test_the_data_dir_is_required(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--port", "0"])
    assert exit_info.value.code == 2
    assert "--data-dir" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--port", "--http-port"])
def test_a_taken_port_is_a_clear_error(tmp_path: Path, listening_socket: socket.socket, flag: str) -> None:
    taken = str(listening_socket.getsockname()[1])
    ports = {"--port": "0", "--http-port": "0", flag: taken}
    result = subprocess.run(serve_command("--data-dir", str(tmp_path / "data"), "--num-coordinators", "1",
                                          *(item for pair in ports.items() for item in pair)),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "ready" not in result.stdout
    assert "cannot serve" in result.stderr and "address already in use" in result.stderr, result.stderr
    assert taken in result.stderr


def test_an_unreachable_etcd_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as sock:                       # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    result = subprocess.run(serve_command("--data-dir", str(tmp_path / "data"), "--port", "0", "--http-port", "0",
                                          "--metadata-store", f"etcd://127.0.0.1:{closed}"),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "ready" not in result.stdout
    assert f"cannot reach etcd at 127.0.0.1:{closed}" in result.stderr, result.stderr
