"""Topic lookups: PARTITIONED_METADATA and LOOKUP (following redirects) over the service URL."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from pyengine.client.backoff import Backoff
from pyengine.client.config import ClientConfig
from pyengine.client.errors import ConnectError
from pyengine.client.pool import ConnectionPool
from pyengine.client.url import BrokerAddress, parse_broker_url
from pyengine.errors import ServiceNotReadyError, TooManyRequestsError
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.commands import base_command

MAX_REDIRECTS = 20
_RETRYABLE = (ConnectError, TimeoutError, ServiceNotReadyError, TooManyRequestsError)
_Lookup = pb.CommandLookupTopicResponse
T = TypeVar("T")


class LookupService:
    def __init__(self, pool: ConnectionPool, service: list[BrokerAddress], config: ClientConfig) -> None:
        self._pool = pool
        self._service = service
        self._next_service = 0
        self._config = config

    def service_address(self) -> BrokerAddress:
        # Several hosts in the service URL: each lookup goes to the next one.
        address = self._service[self._next_service % len(self._service)]
        self._next_service += 1
        return address

    async def partitions(self, topic: str) -> int:
        """How many partitions `topic` has (0: it is not partitioned)."""
        return await self.retrying(f"partitioned metadata of {topic}", lambda: self._partitions_once(topic))

    async def retrying(self, what: str, attempt: Callable[[], Awaitable[T]]) -> T:
        """`attempt()`, asked again with back-off while the broker cannot be reached or is not
        ready, until the operation timeout, as the C++ client's retrying lookup service does
        its lookups, topic lists and schemas: each attempt that asks the service URL goes to
        its next host, so a host that is down is passed over."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._config.operation_timeout
        backoff = Backoff(self._config.initial_backoff, self._config.max_backoff)
        while True:
            try:
                async with asyncio.timeout_at(deadline):    # not wait_for: 3.11's loses a late cancel
                    return await attempt()
            except _RETRYABLE as exc:
                delay = backoff.next()
                if loop.time() + delay >= deadline:
                    if isinstance(exc, TimeoutError):
                        raise
                    raise TimeoutError(f"{what}: {exc}") from exc
                await asyncio.sleep(delay)

    async def _partitions_once(self, topic: str) -> int:
        connection = await self._pool.get(self.service_address())
        cmd = base_command(pb.BaseCommand.PARTITIONED_METADATA, topic=topic, request_id=connection.new_request_id())
        response = await connection.request(cmd, self._config.operation_timeout)
        return response.partitions

    async def lookup(self, topic: str) -> BrokerAddress:
        """The broker that owns `topic` (its logical address is the URL the broker gave)."""
        service = self.service_address()
        address = service
        authoritative = False
        for _ in range(MAX_REDIRECTS):
            connection = await self._pool.get(address)
            cmd = base_command(pb.BaseCommand.LOOKUP, topic=topic, request_id=connection.new_request_id(),
                               authoritative=authoritative)
            response = await connection.request(cmd, self._config.operation_timeout)
            if not response.brokerServiceUrl:
                raise ConnectError(f"lookup of {topic} named no broker")
            target = parse_broker_url(response.brokerServiceUrl)
            if response.proxy_through_service_url:
                target = BrokerAddress(target.logical, service.host, service.port)
            if response.response == _Lookup.Connect:
                return target
            address, authoritative = target, response.authoritative
        raise ConnectError(f"lookup of {topic} was redirected more than {MAX_REDIRECTS} times")
