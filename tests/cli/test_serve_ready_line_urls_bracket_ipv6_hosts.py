"""The `ready` line names the URLs clients connect to: with `--host` an IPv6 address the
Pulsar URL brackets it (`pulsar://[::1]:6650`, as the admin URL already does), else neither
pyengine's client nor the official one can parse it, and the scalable-topic controller would
advertise that unusable URL. (No socket is opened: the protocol server is a stand-in.)"""

from __future__ import annotations

import argparse
import contextlib
from typing import Any

import pytest

from pyengine.cli import serve
from pyengine.client.url import parse_service_url


class StandInServer:
    def __init__(self, service: Any, host: str, port: int, **options: Any) -> None:
        self.port = port or 6650

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass


class StandInService:
    service_url = ""


@pytest.mark.parametrize(("host", "url"), [("::1", "pulsar://[::1]:6650"), ("127.0.0.1", "pulsar://127.0.0.1:6650")])
async def test_the_pulsar_url_of_the_ready_line_is_one_a_client_can_parse(monkeypatch: pytest.MonkeyPatch,
                                                                           host: str, url: str) -> None:
    monkeypatch.setattr(serve, "ProtocolServer", StandInServer)
    service = StandInService()
    endpoints: dict[str, str] = {}
    async with contextlib.AsyncExitStack() as components:
        args = argparse.Namespace(host=host, port=0, max_message_publish_buffer_size_mb=-1)
        await serve.start_protocol_server(args, service, components, endpoints)
    assert endpoints["pulsar"] == url
    assert service.service_url == url
    assert [(a.host, a.port) for a in parse_service_url(endpoints["pulsar"])] == [(host, 6650)]
