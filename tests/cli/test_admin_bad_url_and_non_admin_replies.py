"""`pyengine admin` pointed at the wrong place: a malformed --url is a usage error (exit 2),
and a server that does not answer as the admin API does (not HTTP at all — e.g. the Pulsar
binary port —, a reply that is not JSON, a reply cut short) is `error: ...` on stderr with
exit 1, never a traceback."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from pyengine.cli import main


@pytest.mark.parametrize("url", ["http://[::1", "http://127.0.0.1:abc", "http://127.0.0.1:99999", "localhost:8080",
                                 "ftp://127.0.0.1:21", "http://"])
def test_a_malformed_url_is_a_usage_error(capsys, url: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["admin", "--url", url, "tenants", "list"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--url" in err and url in err, err


def test_a_malformed_url_in_the_environment_is_a_usage_error(capsys, monkeypatch) -> None:
    monkeypatch.setenv("PYENGINE_ADMIN_URL", "http://127.0.0.1:abc")
    with pytest.raises(SystemExit) as exit_info:
        main(["admin", "tenants", "list"])
    assert exit_info.value.code == 2
    assert "--url" in capsys.readouterr().err


@pytest.fixture
def fake_server() -> Iterator[callable]:
    """A one-answer-per-connection TCP server on 127.0.0.1 that sends back canned bytes."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    answer: list[bytes] = [b""]

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:             # shut down: the test is over
                return
            with conn:
                conn.recv(65536)
                conn.sendall(answer[0])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()

    def url_answering(payload: bytes) -> str:
        answer[0] = payload
        return f"http://127.0.0.1:{listener.getsockname()[1]}"

    yield url_answering
    listener.shutdown(socket.SHUT_RDWR)         # wakes the accept() up (Linux)
    listener.close()
    thread.join(timeout=10)


@pytest.mark.parametrize(("payload", "complaint"), [
    (b"\x00\x00\x00\x0bnot http at all\r\n\r\n", "not an HTTP"),                      # a binary protocol port
    (b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\n<html>", "not JSON"),             # some other web server
    (b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{}", "cut short"),               # the broker went away
    (b"HTTP/1.1 500 Oops\r\nContent-Length: 50\r\n\r\n{}", "HTTP 500"),               # an error, cut short
])
def test_a_reply_that_is_not_the_admin_apis_is_a_clear_error(capsys, fake_server, payload: bytes,
                                                             complaint: str) -> None:
    url = fake_server(payload)
    assert main(["admin", "--url", url, "tenants", "list"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("error: ") and complaint in err and "Traceback" not in err, err
