"""What the exactly-once models of consume-transform-produce share
(test_failover_exactly_once_model.py, test_shared_exactly_once_model.py): a hypothesis state
machine's event loop and data dir, its broker (embedded, or in-process behind the network
client when `network`), the rule that restarts that broker and the step that commits across
such a restart (network), the final check that every message was processed by exactly one
committed transaction, and the settings of the embedded and network machines."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections import defaultdict
from typing import Any

from hypothesis import HealthCheck, event, settings
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from pyengine.broker import Broker
from pyengine.client import Client
from pyengine.client.consumer import READY
from pyengine.client.transaction import is_end_refusal
from pyengine.errors import PulsarError
from tests.client.conftest import NetworkBroker

NAMES = ("a", "b", "c")         # the consumers' names, by slot
RESETTLE_S = 0.1                # after a restart: a consumer's reconnect dispatched to
MAX_RESTARTS = 2                # per example


class ExactlyOnceMachine(RuleBasedStateMachine):
    """The plumbing of an exactly-once model; a subclass brings the rules and `_drain_and_check`."""

    network = False
    topic = ""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.dir = tempfile.mkdtemp(prefix=prefix)
        self.client: Any = None
        self.stack: Any = None
        self.consumers: list[object | None] = [None] * len(NAMES)
        self.published = 0
        self.processed: dict[int, list[str]] = defaultdict(list)     # label -> committed txns (with repeats)
        self.txn_count = 0
        self.broken = False
        self.log: list[str] = []
        self.restarts = 0

    def run(self, coro):
        try:
            return self.loop.run_until_complete(asyncio.wait_for(coro, 30))
        except BaseException:
            self.broken = True
            raise

    def run_quietly(self, coro):
        """`run` for an outcome the application handles (a PulsarError is not a broken step)."""
        return self.loop.run_until_complete(asyncio.wait_for(coro, 30))

    async def _open_broker(self, **config: Any) -> None:
        """The broker (with `config`), the client, a producer of `topic` and, on the network,
        a batching one (the embedded machine publishes batches with `publish_batch`)."""
        if self.network:
            self.network_broker = NetworkBroker(self.dir, num_coordinators=1, **config)
            await self.network_broker.start()
            self.service = self.network_broker.service
            self.client = Client(self.network_broker.url, operation_timeout_seconds=10)
            self.producer = await self.client.create_producer(self.topic)
            self.batcher = await self.client.create_producer(self.topic, batching_enabled=True,
                                                             batching_max_publish_delay_ms=50)
        else:
            self.stack = Broker.embedded(self.dir, sync=False, **config)
            self.client = await self.stack.__aenter__()
            self.service = self.client.service
            self.producer = await self.client.create_producer(self.topic)

    async def _close(self) -> None:
        if self.network:
            try:
                await self.client.close()
            finally:
                await self.network_broker.stop()
        else:
            await self.stack.__aexit__(None, None, None)

    async def _restart(self) -> None:
        """What happens next is drawn from what the consumers receive, so the consumers come
        back one at a time, in slot order, each dispatched to before the next subscribes (left
        to their reconnects' timing, the first back would take whatever it has room for)."""
        handlers = [h for c in self.consumers if c is not None for h in c._handlers.values()]
        gates = {h: asyncio.Event() for h in handlers}
        for h in handlers:
            async def subscribe_when_let(connection, h=h, subscribe=h._connection_opened):
                await gates[h].wait()
                await subscribe(connection)
            h._connection_opened = subscribe_when_let
        old = {h: h.connection for h in handlers}
        try:
            await self.network_broker.restart()
            self.service = self.network_broker.service
            await self.service.get_topic(self.topic)    # loaded, as before (the models look at it)
            for h in handlers:
                gates[h].set()
                while h.state != READY or h.connection is old[h]:
                    await asyncio.sleep(0.01)
                await asyncio.sleep(RESETTLE_S)
        finally:
            for h in handlers:
                del h._connection_opened

    @precondition(lambda self: self.network and self.restarts < MAX_RESTARTS)
    @rule()
    def broker_restarts(self) -> None:
        """The broker stops and starts again on its data dir (network only: the client
        reconnects, an embedded consumer is closed with its broker). Open transactions and
        their acks (the pending-ack log) go on; what the consumers held is dispatched again,
        also to other consumers, while the processors still hold their copies."""
        self.run(self._restart())
        self.restarts += 1
        self.log.append("the broker restarted")
        event("the broker restarted")

    async def _commit_across_restart(self, name: str, txn, after_s: float) -> BaseException | None:
        """Commit `txn` while the broker restarts (`after_s` after the commit was asked); a
        commit that failed with no answer (in doubt: the decision may have been taken) is
        asked again, as the client allows, until it is answered. How it failed (None: it
        committed)."""
        commit = asyncio.ensure_future(txn.commit())
        await asyncio.sleep(after_s)
        await self._restart()
        self.restarts += 1
        event("the broker restarted during a commit")
        failure = None
        for _ in range(5):
            try:
                await (commit if failure is None else txn.commit())
                return None
            except PulsarError as exc:
                failure = exc
                if is_end_refusal(exc):
                    return exc
                self.log.append(f"  {name}'s commit in doubt: {exc!r}; asked again")
                event("a commit in doubt across a restart, asked again")
        return failure

    def check_exactly_once(self, detail: str = "") -> None:
        """Every message published processed by exactly one committed transaction, once."""
        duplicated = {f"m{label}": txns for label, txns in self.processed.items() if len(txns) > 1}
        lost = [f"m{label}" for label in range(self.published) if not self.processed.get(label)]
        assert not duplicated and not lost, f"duplicated: {duplicated}, lost: {lost}{detail}\n" + "\n".join(self.log)

    async def _drain_and_check(self) -> None:
        raise NotImplementedError

    def teardown(self) -> None:
        try:
            if self.client is not None:
                try:
                    if not self.broken:
                        self.run(self._drain_and_check())
                finally:
                    self.loop.run_until_complete(self._close())
        finally:
            self.loop.close()
            shutil.rmtree(self.dir, ignore_errors=True)


def model_settings(examples: int) -> settings:
    return settings(max_examples=examples, stateful_step_count=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
