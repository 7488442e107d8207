"""The Pulsar binary protocol server: a listening socket, its connections, and the state they
share (producer access modes, producer names across connections, subscriptions being sought).

    server = ProtocolServer(service, "127.0.0.1", 0)
    await server.start()            # on whatever loop runs it: uvloop when installed
    ... server.port ...
    await server.stop()

Runs on the running event loop: uvloop's when the CLI installed it, asyncio's default loop
otherwise (both are measured).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import pyengine
from pyengine.broker.service import BrokerService
from pyengine.broker.subscription import Subscription
from pyengine.broker.topic import Producer, Topic
from pyengine.errors import ProducerBusyError
from pyengine.protocol.access_modes import ProducerAccessModes
from pyengine.protocol.connection import ServerConnection
from pyengine.protocol.network_producer import NetworkProducer

log = logging.getLogger(__name__)

FRAME_PADDING = 10 * 1024        # Apache accepts frames up to max message size + 10 KiB
# Apache's maxMessagePublishBufferSizeInMB (there half the direct memory): the bytes of sends
# being stored, over every connection, above which the connections with producers stop being
# read until it is back under half.
DEFAULT_PUBLISH_BUFFER_BYTES = 512 * 1024 * 1024


class ProtocolServer:
    def __init__(self, service: BrokerService, host: str = "127.0.0.1", port: int = 6650, *,
                 advertised_url: str | None = None, keepalive_interval: float = 30.0,
                 liveness_timeout: float = 5.0, reader_grace: float = 60.0,
                 max_publish_buffer_bytes: int = DEFAULT_PUBLISH_BUFFER_BYTES) -> None:
        """`advertised_url`: what LOOKUP answers (default: the address each client reached,
        `pulsar://<local address>:<port>`). `keepalive_interval`: seconds of silence before a
        PING; a second silent interval closes the connection (Pulsar: 30). `liveness_timeout`:
        how long a producer name held by another connection waits for that connection to
        prove alive before taking the name over. `reader_grace`: how long a reader's moved
        subscription waits for the reader to come back after a seek. `max_publish_buffer_bytes`:
        the bytes of sends being stored, over all connections, at which the connections with
        producers stop being read, until half of it is left (-1: no limit)."""
        if keepalive_interval <= 0 or liveness_timeout <= 0 or reader_grace <= 0:
            raise ValueError("keepalive_interval, liveness_timeout and reader_grace must be > 0")
        if isinstance(max_publish_buffer_bytes, bool) or not isinstance(max_publish_buffer_bytes, int) \
                or not (max_publish_buffer_bytes > 0 or max_publish_buffer_bytes == -1):
            raise ValueError(f"max_publish_buffer_bytes must be a positive int or -1 (no limit), "
                             f"not {max_publish_buffer_bytes!r}")
        self.service = service
        self.host = host
        self._requested_port = port
        self.advertised_url = advertised_url
        self.keepalive_interval = keepalive_interval
        self.liveness_timeout = liveness_timeout
        self.reader_grace = reader_grace
        self.max_message_size = service.config.max_message_size
        self.max_frame_size = self.max_message_size + FRAME_PADDING
        self.server_version = f"pyengine-{pyengine.__version__}"
        self.access = ProducerAccessModes()
        self.connections: set[ServerConnection] = set()
        self.max_publish_buffer_bytes = max_publish_buffer_bytes
        self.publish_buffer_bytes = 0           # of the sends being stored
        self._publish_buffer_full = False
        self._server: asyncio.AbstractServer | None = None
        self._producer_owners: dict[tuple[str, str], NetworkProducer] = {}
        self._seeks: dict[tuple[str, str], asyncio.Future[None]] = {}
        self._kept_readers: dict[tuple[str, str], tuple[Subscription, asyncio.TimerHandle]] = {}

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("the server is already started")
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: ServerConnection(self), self.host, self._requested_port,
                                                reuse_address=True)
        log.info("Pulsar protocol on %s:%d (%s loop)", self.host, self.port, type(loop).__module__)

    @property
    def port(self) -> int:
        if self._server is None or not self._server.sockets:
            raise RuntimeError("the server is not started")
        return self._server.sockets[0].getsockname()[1]

    async def stop(self, timeout: float = 10.0) -> None:
        """Stop accepting, let every connection's sends in flight be stored and answered,
        then close the connections (their producers and consumers are detached)."""
        if self._server is None:
            return
        server, self._server = self._server, None
        server.close()
        connections = list(self.connections)
        results = await asyncio.gather(*(c.shutdown(timeout) for c in connections), return_exceptions=True)
        for connection, result in zip(connections, results):
            if isinstance(result, BaseException):
                log.warning("%s: not drained before closing: %r", connection.peer, result)
                connection.close()
        for connection in connections:
            await connection.wait_for_tasks()
        for subscription, timer in self._kept_readers.values():
            timer.cancel()
            subscription.topic.unsubscribe_reader(subscription)
        self._kept_readers.clear()
        await server.wait_closed()

    # --- connections ----------------------------------------------------------------------

    def connection_opened(self, connection: ServerConnection) -> None:
        self.connections.add(connection)

    # --- the publish buffer, over all connections ----------------------------------------

    def publish_buffer_grew(self, size: int) -> None:
        self.publish_buffer_bytes += size
        if not self._publish_buffer_full and 0 < self.max_publish_buffer_bytes <= self.publish_buffer_bytes:
            self._publish_buffer_full = True
            log.info("publish buffer full (%d bytes of sends being stored): not reading from producers",
                     self.publish_buffer_bytes)
            for connection in self.connections:
                if connection.producers:
                    connection.throttle_for_publish_buffer(True)

    @property
    def publish_buffer_full(self) -> bool:
        """Whether the connections with producers are not read (the buffer is full)."""
        return self._publish_buffer_full

    def publish_buffer_shrank(self, size: int) -> None:
        self.publish_buffer_bytes -= size
        if self._publish_buffer_full and self.publish_buffer_bytes < self.max_publish_buffer_bytes // 2:
            self._publish_buffer_full = False
            for connection in self.connections:
                connection.throttle_for_publish_buffer(False)

    def connection_closed(self, connection: ServerConnection) -> None:
        self.connections.discard(connection)

    def broker_url_for(self, transport: asyncio.BaseTransport) -> str:
        """The URL LOOKUP answers on this connection: exactly the address the client reached,
        so it keeps using this connection (the client pools connections by URL string)."""
        if self.advertised_url is not None:
            return self.advertised_url
        host, port = transport.get_extra_info("sockname")[:2]
        return f"pulsar://[{host}]:{port}" if ":" in host else f"pulsar://{host}:{port}"

    # --- producers across connections -----------------------------------------------------

    async def attach_producer(self, connection: ServerConnection, topic: Topic, name: str | None) -> Producer:
        """Add a producer to `topic`. A name held by a producer of another connection is
        taken over when that connection does not answer a PING in time (Apache's liveness
        check: a client that reconnects faster than the broker notices its old connection
        died must not be refused its own name)."""
        try:
            return topic.add_producer(name)
        except ProducerBusyError:
            holder = self._producer_owners.get((topic.name, name or ""))
            if holder is None or holder.connection is connection:
                raise
            if await holder.connection.check_liveness(self.liveness_timeout):
                raise
            log.info("%s: taking producer name %r over from silent connection %s", connection.peer, name,
                     holder.connection.peer)
            holder.connection.close()
            return topic.add_producer(name)

    def detach_producer(self, producer: NetworkProducer, *, release_access: bool = True) -> None:
        producer.close()
        key = (producer.topic.name, producer.name)
        if self._producer_owners.get(key) is producer:
            del self._producer_owners[key]
        if release_access:
            self.access.release(producer.topic.name, producer)

    def producer_attached(self, producer: NetworkProducer) -> None:
        self._producer_owners[(producer.topic.name, producer.name)] = producer

    def fence_producer(self, key: object) -> None:
        """Called by the access modes for a producer pushed out by ExclusiveWithFencing."""
        if isinstance(key, NetworkProducer):
            key.connection.fence_producer(key)

    # --- seeks ----------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def seeking(self, topic: str, subscription: str) -> AsyncIterator[None]:
        """Mark a subscription as being moved: its consumers' new SUBSCRIBEs wait for it."""
        key = (topic, subscription)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        previous = self._seeks.get(key)
        self._seeks[key] = done
        try:
            if previous is not None:
                await asyncio.shield(previous)
            yield
        finally:
            done.set_result(None)
            if self._seeks.get(key) is done:
                del self._seeks[key]

    async def wait_for_seek(self, topic: str, subscription: str) -> None:
        seek = self._seeks.get((topic, subscription))
        if seek is not None:
            await asyncio.shield(seek)

    def keep_seeked_reader(self, topic: str, subscription_name: str, subscription: Subscription) -> None:
        """A reader was disconnected by its seek: keep its (moved) non-durable subscription
        for its return — it subscribes again without a start position after a seek by time
        (Apache keeps the subscription across a reset-cursor disconnect)."""
        key = (topic, subscription_name)
        old = self._kept_readers.pop(key, None)
        if old is not None:
            old[1].cancel()
            old[0].topic.unsubscribe_reader(old[0])
        timer = asyncio.get_running_loop().call_later(self.reader_grace, self._drop_kept_reader, key)
        self._kept_readers[key] = (subscription, timer)

    def take_seeked_reader(self, topic: Topic, subscription_name: str) -> Subscription | None:
        kept = self._kept_readers.pop((topic.name, subscription_name), None)
        if kept is None:
            return None
        kept[1].cancel()
        if kept[0].topic is not topic:
            # Kept on a topic deleted or unloaded since: taken, the reader read the old
            # topic's ledger for good, nothing published after it ever delivered.
            kept[0].topic.unsubscribe_reader(kept[0])
            return None
        return kept[0]

    def _drop_kept_reader(self, key: tuple[str, str]) -> None:
        kept = self._kept_readers.pop(key, None)
        if kept is not None and not kept[0].consumers:
            kept[0].topic.unsubscribe_reader(kept[0])
