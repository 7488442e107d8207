"""`pyengine serve`: a broker on a data dir, speaking the Pulsar binary protocol.

    pyengine serve --data-dir ./data --port 6650 --http-port 8080 [--metadata-store lmdb|memory|etcd://HOST:PORT]

The Pulsar protocol listens on --port, the admin REST API, `/openapi.json` and `/metrics` on
--http-port (0 for either: a free port, named in the ready line). The metadata store (default:
LMDB inside the data dir) is opened by the broker service and kept open while it runs.

Runs on uvloop (PYENGINE_EVENT_LOOP=asyncio: on asyncio's default loop, for comparisons).
Prints one line containing `ready` (with the URLs it serves) once it accepts connections.
Log lines go to stderr from a thread of their own: a stderr pipe nobody reads never stalls it.
SIGTERM / SIGINT stop it cleanly: no new connections, the sends in flight are stored and
answered, the connections are closed, the storage is drained and closed; exit 0.
After a SIGKILL, a restart on the same data dir recovers every acknowledged write and every
committed or aborted transaction. One broker per data dir: a second `pyengine serve` on a data
dir in use is refused (exit 1), as is a data dir that is not a directory or holds no usable
LMDB environment, with one `cannot serve: ...` line each.

`run_broker` starts the components in order (storage and coordinators, then each server) and
stops them in reverse; a new server is one more `start_*` step that adds its endpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import queue
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Coroutine

import uvloop

from pyengine.admin import AdminServer
from pyengine.admin.schemas import MAX_PARTITIONS
from pyengine.cli.argtypes import whole_number
from pyengine.broker.policies import BACKLOG_RETENTION_POLICIES, TOPIC_TYPES, Retention
from pyengine.broker.service import BrokerConfig, BrokerService
from pyengine.cli.gc_tuning import settled_garbage_collector
from pyengine.cli.malloc_tuning import keep_freed_heap
from pyengine.metadata import MetadataStoreError
from pyengine.protocol.server import DEFAULT_PUBLISH_BUFFER_BYTES, ProtocolServer
from pyengine.storage.errors import StorageError

log = logging.getLogger("pyengine.serve")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run a broker (Pulsar binary protocol) on a data dir")
    p.add_argument("--data-dir", type=data_dir_path, required=True, help="where the broker stores everything (LMDB)")
    p.add_argument("--port", type=port_number, default=6650, help="Pulsar protocol port (0: pick a free one)")
    p.add_argument("--http-port", type=port_number, default=8080,
                   help="admin REST API, /openapi.json and /metrics (0: pick a free one)")
    p.add_argument("--metadata-store", type=metadata_store_url, default="lmdb",
                   help="lmdb (inside the data dir), memory, or etcd://HOST:PORT")
    p.add_argument("--host", type=listen_host, default="127.0.0.1",
                   help="address to listen on (0.0.0.0 or ::: every interface)")
    p.add_argument("--broker-id", default="0", help="this broker's name in a cluster")
    p.add_argument("--num-coordinators", type=coordinators, default=16,
                   help=f"transaction coordinators (Pulsar: 16; at most {MAX_PARTITIONS})")
    p.add_argument("--no-fsync", action="store_true",
                   help="do not fsync group commits (a machine crash may lose the last ones)")
    p.add_argument("--dedup", action="store_true",
                   help="de-duplicate sends by producer name and sequence id on every namespace by default")
    p.add_argument("--retention-time-minutes", type=retention_limit, default=-1,
                   help="minutes to keep consumed ledgers where no namespace or topic policy says (Pulsar's "
                        "defaultRetentionTimeInMinutes; -1, the default here: no limit; Pulsar's default is 0)")
    p.add_argument("--retention-size-mb", type=retention_limit, default=-1,
                   help="MB of consumed ledgers to keep per topic by default (Pulsar's defaultRetentionSizeInMB; "
                        "-1, the default here: no limit; 0 with --retention-time-minutes 0: keep none)")
    p.add_argument("--no-delayed-delivery", action="store_true",
                   help="deliver messages with a deliver_at_time at once where no namespace or topic policy says "
                        "otherwise (Pulsar's delayedDeliveryEnabled=false)")
    p.add_argument("--delayed-delivery-tick-time-ms", type=non_negative_int, default=1000,
                   help="tick of the timer releasing delayed messages by default (Pulsar's "
                        "delayedDeliveryTickTimeMillis, 1000)")
    p.add_argument("--delayed-delivery-max-delay-ms", type=non_negative_int, default=0,
                   help="refuse sends delayed by more than this by default (Pulsar's delayedDeliveryMaxDelayInMillis; "
                        "0, the default: no limit)")
    p.add_argument("--no-delayed-delivery-strict", action="store_true",
                   help="let a delayed message out up to a tick early (Pulsar's default, "
                        "isDelayedDeliveryDeliverAtTimeStrict=false); by default never before its time")
    p.add_argument("--ttl-duration-default-seconds", type=message_ttl, default=0,
                   help="message TTL where no namespace or topic policy says (Pulsar's ttlDurationDefaultInSeconds; "
                        "0, the default: messages do not expire)")
    p.add_argument("--message-expiry-check-interval-seconds", type=positive_seconds, default=300.0,
                   help="how often topics expire their subscriptions' messages older than their TTL "
                        "(Pulsar's messageExpiryCheckIntervalInMinutes: 5 minutes)")
    p.add_argument("--max-message-publish-buffer-size-mb", type=publish_buffer_mb,
                   default=DEFAULT_PUBLISH_BUFFER_BYTES // (1024 * 1024),
                   help="sends being stored over all connections, in MB, at which connections with producers "
                        "stop being read until half of it is left (Pulsar's maxMessagePublishBufferSizeInMB; "
                        "-1: no limit)")
    p.add_argument("--max-unacked-messages-per-consumer", type=unacked_limit, default=50_000,
                   help="Shared and Key_Shared: a consumer holding this many unacknowledged messages gets no more "
                        "until it acknowledges half of them, where no policy says (Pulsar's "
                        "maxUnackedMessagesPerConsumer, 50000; 0: no limit)")
    p.add_argument("--max-unacked-messages-per-subscription", type=unacked_limit, default=200_000,
                   help="the same for all the consumers of a Shared or Key_Shared subscription together (Pulsar's "
                        "maxUnackedMessagesPerSubscription, 200000; 0: no limit)")
    p.add_argument("--key-shared-look-ahead-msg-in-replay-threshold-per-consumer", type=look_ahead_threshold,
                   default=2000,
                   help="Key_Shared: new entries are not read while this many per consumer are held back for "
                        "redelivery (Pulsar's keySharedLookAheadMsgInReplayThresholdPerConsumer, 2000; 0: only the "
                        "per-subscription threshold)")
    p.add_argument("--key-shared-look-ahead-msg-in-replay-threshold-per-subscription", type=look_ahead_threshold,
                   default=20_000,
                   help="the same for the whole subscription, at most (Pulsar's "
                        "keySharedLookAheadMsgInReplayThresholdPerSubscription, 20000; both 0: the unacked-messages "
                        "limits instead)")
    p.add_argument("--active-consumer-failover-delay-time-ms", type=non_negative_int, default=1000,
                   help="Failover: when another consumer becomes the active one, deliver nothing for this long "
                        "before it gets what the previous one left unacknowledged (Pulsar's "
                        "activeConsumerFailoverDelayTimeMillis, 1000; 0: at once)")
    p.add_argument("--backlog-quota-default-limit-bytes", type=whole_number(-1, 2**63 - 1, meaning=" (-1: no quota)"),
                   default=-1, help="a topic's backlog may hold this many bytes where no policy says (Pulsar's "
                                    "backlogQuotaDefaultLimitBytes; -1, the default: no quota)")
    p.add_argument("--backlog-quota-default-limit-second", type=whole_number(-1, 2**31 - 1, meaning=" (-1: no quota)"),
                   default=-1, help="the oldest message of a topic's backlog may be this many seconds old where no "
                                    "policy says (Pulsar's backlogQuotaDefaultLimitSecond; -1, the default: no quota)")
    p.add_argument("--backlog-quota-default-retention-policy", default="producer_request_hold",
                   choices=BACKLOG_RETENTION_POLICIES,
                   help="what a topic past its default backlog quota does (Pulsar's "
                        "backlogQuotaDefaultRetentionPolicy, producer_request_hold)")
    p.add_argument("--backlog-quota-check-interval-seconds", type=positive_seconds, default=60.0,
                   help="how often topics are checked against their backlog quotas (Pulsar's "
                        "backlogQuotaCheckIntervalInSeconds: 60)")
    p.add_argument("--stats-update-interval-seconds", type=positive_seconds, default=60.0,
                   help="how often the rates of the topic stats (msgRateIn, msgRateOut, ...) are computed, each "
                        "over the interval since the last (Pulsar's statsUpdateFrequencyInSecs: 60)")
    p.add_argument("--no-delete-inactive-topics", action="store_true",
                   help="never delete topics for being inactive where no policy says (Pulsar's "
                        "brokerDeleteInactiveTopicsEnabled=false). Even when on, a topic is kept for its retention "
                        "time, unlimited by default")
    p.add_argument("--delete-inactive-topics-mode", default="delete_when_no_subscriptions",
                   choices=("delete_when_no_subscriptions", "delete_when_subscriptions_caught_up"),
                   help="what inactive means besides no producer and no consumer: no subscription, or none with a "
                        "backlog (Pulsar's brokerDeleteInactiveTopicsMode, delete_when_no_subscriptions)")
    p.add_argument("--delete-inactive-topics-max-inactive-duration-seconds", type=message_ttl, default=None,
                   help="how long a topic must be inactive to be deleted (Pulsar's "
                        "brokerDeleteInactiveTopicsMaxInactiveDurationSeconds; default: the check's frequency)")
    p.add_argument("--delete-inactive-topics-frequency-seconds", type=positive_seconds, default=60.0,
                   help="how often topics are checked for inactivity (Pulsar's "
                        "brokerDeleteInactiveTopicsFrequencySeconds: 60)")
    p.add_argument("--no-auto-topic-creation", action="store_true",
                   help="a producer or consumer of a topic that does not exist is refused (TopicNotFound) where no "
                        "namespace override says (Pulsar's allowAutoTopicCreation=false)")
    p.add_argument("--auto-topic-creation-type", default="non-partitioned", choices=TOPIC_TYPES,
                   help="what a topic created on first use is where no namespace override says (Pulsar's "
                        "allowAutoTopicCreationType, non-partitioned)")
    p.add_argument("--default-num-partitions", type=partition_count, default=1,
                   help="the partitions of a topic created on first use as partitioned (Pulsar's "
                        f"defaultNumPartitions: 1; at most {MAX_PARTITIONS})")
    p.add_argument("--no-auto-subscription-creation", action="store_true",
                   help="a consumer of a durable subscription that does not exist is refused (SubscriptionNotFound), "
                        "and a producer's initial subscription is not created, where no topic or namespace override "
                        "says (Pulsar's allowAutoSubscriptionCreation=false)")
    p.add_argument("--no-scalable-topics", action="store_true",
                   help="refuse scalable topics (topic://, segment://) and never run their controllers "
                        "(Pulsar's scalableTopicEnabled=false)")
    p.add_argument("--scalable-session-ttl", type=positive_seconds, default=10.0,
                   help="seconds a dead scalable-topic controller leader keeps its lock (failover time)")
    p.add_argument("--scalable-grace-period", type=positive_seconds, default=30.0,
                   help="seconds a disconnected ordered consumer of a scalable topic keeps its segments")


# An empty value (a script's unset variable) is refused: as a path it was the current directory,
# as a host every interface, announced as `pulsar://:PORT`, a URL no client can use.
def data_dir_path(text: str) -> Path:
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path is not a data dir")
    return Path(text)


def listen_host(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty address: give one, or 0.0.0.0 or :: for every interface")
    return text


def port_number(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not between 0 and 65535")
    return port


# As many as the admin API lets them grow to (each is started at once: a typo of a few more
# digits held the start for minutes and ran the host out of memory).
coordinators = whole_number(1, MAX_PARTITIONS, unit=" transaction coordinators")
partition_count = whole_number(1, MAX_PARTITIONS, unit=" partitions")
non_negative_int = whole_number(0)
message_ttl = whole_number(0, 2**31 - 1, unit=" seconds")
retention_limit = whole_number(-1, meaning=" (-1: no limit)")
unacked_limit = whole_number(0, 2**31 - 1, meaning=" (0: no limit)", unit=" messages")
look_ahead_threshold = whole_number(0, 2**31 - 1, unit=" messages")


def publish_buffer_mb(text: str) -> int:
    """A size in MB of at least 1, or -1 (no limit)."""
    value = whole_number(-1, 2**31 - 1, meaning=" (-1: no limit)", unit=" MB")(text)
    if value == 0:
        raise argparse.ArgumentTypeError("0 is not a buffer size: at least 1 MB, or -1 for no limit")
    return value


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value <= 86400:
        raise argparse.ArgumentTypeError(f"{value} is not between 0 and 86400 seconds")
    return value


def metadata_store_url(text: str) -> str:
    """`lmdb`, `memory` or `etcd://HOST:PORT`, checked before anything starts."""
    if text in ("lmdb", "memory"):
        return text
    if text.startswith("etcd://"):
        host, sep, port = text[len("etcd://"):].rstrip("/").rpartition(":")
        if sep and host and port.isdigit() and 0 < int(port) <= 65535:
            return text
        raise argparse.ArgumentTypeError(f"{text!r} is not etcd://HOST:PORT")
    raise argparse.ArgumentTypeError(f"{text!r} is not one of lmdb, memory, etcd://HOST:PORT")


def run(args: argparse.Namespace) -> int:
    try:
        Retention(args.retention_time_minutes, args.retention_size_mb)
    except ValueError as exc:          # refused as argparse refuses a flag, before anything starts
        print(f"pyengine serve: error: --retention-time-minutes / --retention-size-mb: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    writer = log_to_stderr_off_the_loop()
    keep_freed_heap()
    try:
        run_on_chosen_loop(run_broker(args))
    except (OSError, StorageError, MetadataStoreError) as exc:
        # a port is taken, the data dir is unusable or in use (by another process), etcd is away
        log.error("cannot serve: %s", exc)
        return 1
    finally:
        writer.close()
    return 0


class StderrWriter(logging.Handler):
    """Log lines go to stderr from a thread of their own, never from the event loop: a harness
    that pipes stderr and never reads it fills the pipe, and a blocking write there would stall
    every connection. Lines wait in memory meanwhile. The thread writes to file descriptor 2
    itself (not through `sys.stderr` and its lock), and `close` waits at most `CLOSE_TIMEOUT_S`
    for a pipe nobody drains, so the process still exits promptly. At most `MAX_QUEUED` lines
    wait: beyond that (a pipe nobody drains, for hours) new lines are dropped, not the memory."""

    CLOSE_TIMEOUT_S = 2.0
    MAX_QUEUED = 100_000

    def __init__(self) -> None:
        super().__init__()
        self._lines: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        try:
            self._fd: int | None = sys.stderr.fileno()
        except (AttributeError, OSError, ValueError):      # a stand-in stderr (tests): write to it
            self._fd = None
        self._closing = False
        self._thread = threading.Thread(target=self._write, name="pyengine-log", daemon=True)
        self._thread.start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if self._lines.qsize() < self.MAX_QUEUED:
                self._lines.put((self.format(record) + "\n").encode("utf-8", "backslashreplace"))
        except Exception:
            self.handleError(record)

    def _write(self) -> None:
        while (line := self._lines.get()) is not None:
            try:
                if self._fd is None:
                    sys.stderr.write(line.decode())
                    sys.stderr.flush()
                while self._fd is not None and line:
                    line = line[os.write(self._fd, line):]
            except (OSError, ValueError):     # stderr closed or gone: nothing to tell anyone
                pass

    def close(self) -> None:                  # called again by logging at exit: wait only once
        if self._thread.is_alive() and not self._closing:
            self._closing = True
            self._lines.put(None)
            self._thread.join(self.CLOSE_TIMEOUT_S)
        logging.getLogger().removeHandler(self)
        super().close()


def log_to_stderr_off_the_loop() -> StderrWriter:
    sys.stderr.flush()
    writer = StderrWriter()
    writer.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[writer])      # no-op where logging is set up already
    return writer


LOOP_ENV = "PYENGINE_EVENT_LOOP"
LOOPS = ("uvloop", "asyncio")


def run_on_chosen_loop(main: Coroutine[Any, Any, None]) -> None:
    """uvloop, unless PYENGINE_EVENT_LOOP=asyncio asks for asyncio's default loop (for
    comparisons: the broker benchmark measures both)."""
    choice = os.environ.get(LOOP_ENV, "uvloop")
    if choice not in LOOPS:
        main.close()
        raise SystemExit(f"{LOOP_ENV} must be one of {', '.join(LOOPS)}, not {choice!r}")
    if choice == "asyncio":
        asyncio.run(main)
    else:
        uvloop.run(main)


def broker_config(args: argparse.Namespace) -> BrokerConfig:
    return BrokerConfig(data_dir=args.data_dir, sync=not args.no_fsync, broker_id=args.broker_id,
                        num_coordinators=args.num_coordinators, deduplication_enabled=args.dedup,
                        metadata_store=args.metadata_store, scalable_session_ttl=args.scalable_session_ttl,
                        scalable_grace_period=args.scalable_grace_period,
                        scalable_topic_enabled=not args.no_scalable_topics,
                        retention=Retention(args.retention_time_minutes, args.retention_size_mb),
                        delayed_delivery_enabled=not args.no_delayed_delivery,
                        delayed_delivery_tick_time_ms=args.delayed_delivery_tick_time_ms,
                        delayed_delivery_max_delay_ms=args.delayed_delivery_max_delay_ms,
                        delayed_delivery_deliver_at_time_strict=not args.no_delayed_delivery_strict,
                        ttl_duration_default_seconds=args.ttl_duration_default_seconds,
                        message_expiry_check_interval_s=args.message_expiry_check_interval_seconds,
                        max_unacked_messages_per_consumer=args.max_unacked_messages_per_consumer,
                        max_unacked_messages_per_subscription=args.max_unacked_messages_per_subscription,
                        key_shared_look_ahead_msg_in_replay_threshold_per_consumer=(
                            args.key_shared_look_ahead_msg_in_replay_threshold_per_consumer),
                        key_shared_look_ahead_msg_in_replay_threshold_per_subscription=(
                            args.key_shared_look_ahead_msg_in_replay_threshold_per_subscription),
                        active_consumer_failover_delay_time_ms=args.active_consumer_failover_delay_time_ms,
                        backlog_quota_default_limit_bytes=args.backlog_quota_default_limit_bytes,
                        backlog_quota_default_limit_seconds=args.backlog_quota_default_limit_second,
                        backlog_quota_default_retention_policy=args.backlog_quota_default_retention_policy,
                        backlog_quota_check_interval_s=args.backlog_quota_check_interval_seconds,
                        stats_update_interval_s=args.stats_update_interval_seconds,
                        delete_inactive_topics_enabled=not args.no_delete_inactive_topics,
                        delete_inactive_topics_mode=args.delete_inactive_topics_mode,
                        delete_inactive_topics_max_inactive_duration_s=(
                            args.delete_inactive_topics_max_inactive_duration_seconds),
                        delete_inactive_topics_frequency_s=args.delete_inactive_topics_frequency_seconds,
                        allow_auto_topic_creation=not args.no_auto_topic_creation,
                        allow_auto_topic_creation_type=args.auto_topic_creation_type,
                        default_num_partitions=args.default_num_partitions,
                        allow_auto_subscription_creation=not args.no_auto_subscription_creation)


async def run_broker(args: argparse.Namespace) -> None:
    """Serve until SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with contextlib.AsyncExitStack() as components:
        endpoints: dict[str, str] = {}
        service = await start_service(args, components)
        await start_protocol_server(args, service, components, endpoints)
        await start_admin_server(args, service, components, endpoints)
        if not stop.is_set():        # a stop asked for during the start: no ready line to act on
            with settled_garbage_collector():
                announce_ready(args, endpoints)
                await stop.wait()
        log.info("stopping")
    log.info("stopped")


async def start_service(args: argparse.Namespace, components: contextlib.AsyncExitStack) -> BrokerService:
    if args.data_dir.exists() and not args.data_dir.is_dir():
        raise NotADirectoryError(f"the data dir {args.data_dir} is not a directory")
    args.data_dir.mkdir(parents=True, exist_ok=True)
    service = BrokerService(broker_config(args))
    components.push_async_callback(service.close)
    await service.start()
    return service


async def start_protocol_server(args: argparse.Namespace, service: BrokerService,
                                components: contextlib.AsyncExitStack, endpoints: dict[str, str]) -> ProtocolServer:
    buffer_mb = args.max_message_publish_buffer_size_mb
    server = ProtocolServer(service, args.host, args.port,
                            max_publish_buffer_bytes=-1 if buffer_mb == -1 else buffer_mb * 1024 * 1024)
    await server.start()
    components.push_async_callback(server.stop)
    host = f"[{args.host}]" if ":" in args.host else args.host      # an IPv6 address, as in a URL
    endpoints["pulsar"] = f"pulsar://{host}:{server.port}"
    service.service_url = endpoints["pulsar"]      # the scalable-topic controller's election value
    return server


async def start_admin_server(args: argparse.Namespace, service: BrokerService,
                             components: contextlib.AsyncExitStack, endpoints: dict[str, str]) -> AdminServer:
    server = AdminServer(service, args.host, args.http_port)
    await server.start()
    components.push_async_callback(server.stop)
    endpoints["http"] = server.url
    service.web_service_url = server.url        # where other brokers send segment operations
    endpoints["metrics"] = f"{server.url}/metrics"
    return server


def announce_ready(args: argparse.Namespace, endpoints: dict[str, str]) -> None:
    """The one line that says the broker accepts connections (tests and scripts wait for it)."""
    urls = " ".join(f"{name}={url}" for name, url in endpoints.items())
    print(f"pyengine broker {args.broker_id} ready: {urls} data_dir={args.data_dir}", flush=True)
