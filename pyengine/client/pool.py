"""Connections shared by every producer, consumer and coordinator handler of a client, one per
broker, keyed by the broker's logical address (the URL string, as the C++ client keys them)."""

from __future__ import annotations

import asyncio
import itertools

from pyengine.client.config import ClientConfig
from pyengine.client.connection import ClientConnection
from pyengine.client.errors import AlreadyClosedError, ConnectError
from pyengine.client.url import BrokerAddress
from pyengine.concurrency import single_flight


class ConnectionPool:
    def __init__(self, config: ClientConfig) -> None:
        self._config = config
        self.request_ids = itertools.count()       # one counter for the whole client
        self._connections: dict[str, ClientConnection] = {}
        self._connecting: dict[str, asyncio.Future[ClientConnection]] = {}
        self._closed = False

    async def get(self, address: BrokerAddress) -> ClientConnection:
        """A connection to `address` that has completed its handshake (made if needed)."""
        if self._closed:
            raise AlreadyClosedError("the client is closed")
        connection = self._connections.get(address.logical)
        if connection is not None and connection.usable:
            return connection
        try:
            return await single_flight(self._connecting, address.logical, lambda: self._connect(address))
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if self._closed and current is not None and not current.cancelling():
                # close() cancelled the connecting, not this caller's task: its operation fails
                # as the Java and C++ clients fail what is under way at close
                raise AlreadyClosedError("the client is closed") from None
            raise

    async def _connect(self, address: BrokerAddress) -> ClientConnection:
        loop = asyncio.get_running_loop()
        timeout = self._config.connection_timeout
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(lambda: ClientConnection(address, self._config, self.request_ids),
                                       address.host, address.port), timeout)
        except TimeoutError:
            raise ConnectError(f"cannot connect to {address.logical} within {timeout}s") from None
        except OSError as exc:
            raise ConnectError(f"cannot connect to {address.logical}: {exc}") from exc
        try:
            await connection.wait_connected(timeout)
        except BaseException as exc:
            # Cancelled too (close() cancels the connections being made): known to no one, an
            # open connection would stay so, PINGing the broker once it answers.
            connection.close(exc if isinstance(exc, Exception) else AlreadyClosedError("the client is closed"))
            raise
        if self._closed:
            connection.close(AlreadyClosedError("the client is closed"))
            raise AlreadyClosedError("the client is closed")
        self._connections[address.logical] = connection
        connection.add_close_listener(self._forget)
        return connection

    def _forget(self, connection: ClientConnection) -> None:
        if self._connections.get(connection.address.logical) is connection:
            del self._connections[connection.address.logical]

    def connections(self) -> list[ClientConnection]:
        return list(self._connections.values())

    async def close(self) -> None:
        self._closed = True
        for connecting in list(self._connecting.values()):
            connecting.cancel()
        connections = list(self._connections.values())
        for connection in connections:
            connection.close(AlreadyClosedError("the client is closed"))
        if connections:
            await asyncio.wait([asyncio.ensure_future(c.closed) for c in connections], timeout=5)
