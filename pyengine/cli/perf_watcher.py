"""The consumer of `pyengine perf txn`'s commit-to-visible figure, as its own process.

    python -c "from pyengine.cli.perf_watcher import main; raise SystemExit(main())" \
        URL TOPIC SUBSCRIPTION OPERATION_TIMEOUT_S

A separate application watching the topic is a separate process: run inside the load
generator, this consumer decoded every message on the event loop that also sends and times
the END_TXN round trips, and its work showed up as END_TXN latency. It subscribes (exclusive,
from the latest message), then writes to stdout one record per transaction it sees: the
transaction's number (the first 8 bytes of its payloads) and the CLOCK_MONOTONIC time of the
transaction's first message, which the load generator compares with the time its commit was
acknowledged (the same clock on the same host). The first record, number READY, says the
subscription is in place. It runs until SIGTERM or SIGINT, then unsubscribes; a failure is
reported on stderr with exit status 1.
"""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import struct
import sys
import tempfile
import time
from typing import Any

RECORD = struct.Struct(">Qd")          # transaction number, monotonic seconds
READY = (1 << 64) - 1                  # not a number perf gives a transaction (they stay below 2**62)
# (`-m pyengine.cli.perf_watcher` would import this module twice: the package imports it first)
_RUN_MAIN = "from pyengine.cli.perf_watcher import main; raise SystemExit(main())"
TXN_TAG = struct.Struct(">Q")          # as pyengine.cli.perf writes it at the head of each payload
ACK_EVERY = 1000                       # cumulative acknowledgement every this many messages


async def watch(url: str, topic: str, subscription: str, operation_timeout: float, out: int) -> None:
    from pyengine.client import Client

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    pending = bytearray()
    flush_scheduled = False

    def flush() -> None:
        # Once per burst of received messages (the receiving task yields when none is queued).
        nonlocal flush_scheduled
        flush_scheduled = False
        if pending:
            os.write(out, pending)
            pending.clear()

    async with Client(url, operation_timeout_seconds=operation_timeout,
                      connection_timeout_ms=int(operation_timeout * 1000)) as client:
        consumer = await client.subscribe(topic, subscription, consumer_type="exclusive",
                                          initial_position="latest", receiver_queue_size=5000)
        os.write(out, RECORD.pack(READY, time.monotonic()))
        seen: set[int] = set()

        async def receive() -> None:
            nonlocal flush_scheduled
            received = 0
            while True:
                # (returns without yielding while messages are queued: `flush` runs once a
                # burst has been taken)
                message = await consumer.receive()
                number = TXN_TAG.unpack_from(message.data)[0] if len(message.data) >= TXN_TAG.size else None
                if number is not None and number != READY and number not in seen:
                    seen.add(number)
                    pending.extend(RECORD.pack(number, time.monotonic()))
                    if not flush_scheduled:
                        flush_scheduled = True
                        loop.call_soon(flush)
                received += 1
                if received % ACK_EVERY == 0:
                    await consumer.acknowledge_cumulative(message)

        receiving = asyncio.ensure_future(receive())
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait((receiving, stopping), return_when=asyncio.FIRST_COMPLETED)
        for task in (receiving, stopping):
            task.cancel()
        if receiving.done() and not receiving.cancelled() and receiving.exception() is not None:
            raise receiving.exception()
        flush()
        await consumer.unsubscribe()      # leaves no subscription holding the topic's backlog


class WatcherFailed(RuntimeError):
    """The watcher process could not subscribe, or ended before it was told to."""


class WatcherProcess:
    """The load generator's side: the watcher as a child process, and the records it writes."""

    def __init__(self, process: asyncio.subprocess.Process, stderr: Any) -> None:
        self._process = process
        self._stderr = stderr              # a file, not a pipe: nobody reads it while it runs
        self._rest = b""
        self._cpu_before = _children_cpu()

    @classmethod
    async def start(cls, url: str, topic: str, subscription: str, operation_timeout: float) -> WatcherProcess:
        """Start the watcher and wait until it is subscribed."""
        stderr = tempfile.TemporaryFile()
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _RUN_MAIN, url, topic, subscription, repr(operation_timeout),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=stderr)
        watcher = cls(process, stderr)
        try:
            # (the interpreter's start-up and imports come before the subscription's timeout)
            records = await watcher.records(timeout=operation_timeout + 30.0)
        except BaseException:
            await watcher.stop()
            raise
        if not records or records[0][0] != READY:
            await watcher.stop()
            raise WatcherFailed("the visibility watcher did not subscribe in time")
        return watcher

    async def records(self, timeout: float) -> list[tuple[int, float]]:
        """The records written since the last call (waiting up to `timeout` seconds for the
        first); WatcherFailed if the process ended."""
        assert self._process.stdout is not None
        try:
            data = await asyncio.wait_for(self._process.stdout.read(64 * 1024), timeout)
        except TimeoutError:
            return []
        if not data:
            await self._process.wait()
            self._stderr.seek(0)
            reason = self._stderr.read()[-2000:].decode(errors="replace").strip()
            raise WatcherFailed(f"the visibility watcher ended (exit {self._process.returncode})"
                                + (f": {reason}" if reason else ""))
        data = self._rest + data
        whole = len(data) - len(data) % RECORD.size
        self._rest = data[whole:]
        return list(RECORD.iter_unpack(data[:whole]))

    async def stop(self) -> float:
        """Stop the watcher; returns the CPU seconds it used."""
        if self._process.returncode is None:
            try:
                self._process.terminate()
            except ProcessLookupError:
                pass
            try:
                await asyncio.wait_for(self._process.wait(), 10.0)
            except TimeoutError:
                self._process.kill()
                await self._process.wait()
        self._stderr.close()
        return _children_cpu() - self._cpu_before


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 4:
        print("usage: perf_watcher URL TOPIC SUBSCRIPTION OPERATION_TIMEOUT_S", file=sys.stderr)
        return 2
    url, topic, subscription, timeout = args
    try:
        operation_timeout = float(timeout)
    except ValueError:
        operation_timeout = -1.0
    if not operation_timeout > 0:
        print(f"perf_watcher: OPERATION_TIMEOUT_S must be a positive number, not {timeout!r}", file=sys.stderr)
        return 2
    import uvloop

    from pyengine.cli.gc_tuning import settled_garbage_collector
    from pyengine.cli.malloc_tuning import keep_freed_heap

    keep_freed_heap()                  # tuned as the load generator that starts it
    try:
        with settled_garbage_collector():
            uvloop.run(watch(url, topic, subscription, operation_timeout, sys.stdout.fileno()))
    except Exception as exc:         # reported to the load generator, which fails the run
        print(f"perf_watcher: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
