"""ScalableTopicService: the broker's scalable topics (one per broker).

Creates and deletes scalable topics (their metadata and segment topics), keeps one
`ScalableTopicController` per topic it has been asked about — each stands for election, so a
broker that knows a topic takes over when its leader dies — and routes split, merge,
subscription and consumer requests to them. All controllers share one metadata-store session:
when it ends (the broker lost the store for longer than its ttl) the controllers are dropped and
the next request opens a new session and new controllers.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from pyengine.errors import InvalidTopicNameError, NotAllowedError, TopicNotFoundError
from pyengine.metadata import MetadataStore, Session
from pyengine.naming import TopicName
from pyengine.scalable.controller import Fault, NotLeaderError, ScalableTopicController
from pyengine.scalable.layout import SegmentLayout
from pyengine.scalable.resources import ScalableTopicNotFoundError, ScalableTopicResources
from pyengine.scalable.segments import LocalSegments, SegmentOperations
from pyengine.schema import schema_id

log = logging.getLogger(__name__)

DEFAULT_SESSION_TTL = 10.0          # seconds: a dead leader is replaced within this
DEFAULT_GRACE_PERIOD = 30.0         # seconds a disconnected ordered consumer keeps its segments


def scalable_topic_name(name: str | TopicName) -> TopicName:
    """A `topic://` name (a short `tenant/ns/topic` gets the topic:// domain)."""
    if isinstance(name, TopicName):
        topic = name
    else:
        if not isinstance(name, str):
            raise InvalidTopicNameError(f"a topic name is a string, not {type(name).__name__}")
        topic = TopicName.parse(name if "://" in name else f"topic://{name}")
    if not topic.is_scalable:
        raise InvalidTopicNameError(f"{topic} is not a scalable topic (expected topic://tenant/namespace/topic)")
    return topic


class ScalableTopicService:
    def __init__(self, store: MetadataStore, segments: SegmentOperations, broker_url: str, *,
                 session_ttl: float = DEFAULT_SESSION_TTL, grace_period: float = DEFAULT_GRACE_PERIOD,
                 fault: Fault | None = None, web_service_url: str | None = None) -> None:
        self.store = store
        self.web_service_url = web_service_url
        self.resources = ScalableTopicResources(store)
        if isinstance(segments, LocalSegments) and segments.resources is None:
            segments.resources = self.resources      # creates and deletes fenced (segments.py)
        self.segments = segments
        self.broker_url = broker_url
        self.session_ttl = session_ttl
        self.grace_period = grace_period
        self.fault = fault
        self.controllers: dict[str, ScalableTopicController] = {}
        self._creating: dict[str, asyncio.Future[ScalableTopicController]] = {}
        self._session: Session | None = None
        self._session_lock = asyncio.Lock()
        self._reclaiming: asyncio.Future[None] | None = None
        self._renewing: asyncio.Task | None = None
        self._closed = False

    async def start(self) -> ScalableTopicService:
        await self._ensure_session()
        if self._reclaiming is None:
            self._reclaiming = asyncio.ensure_future(self._reclaim_local_segments())
        await asyncio.shield(self._reclaiming)
        return self

    async def _reclaim_local_segments(self) -> None:
        """Segments stored in this broker's data dir whose owner record names a broker that is
        not running (this broker before a restart on other ports: its URL changed) are owned
        by this broker's URL again. A segment lives in one data dir; left naming the old URL,
        lookups and segment operations would go to a dead address for good."""
        broker = self._local_broker()
        if broker is None or not self.broker_url:
            return
        for name in broker.list_topics():
            segment = TopicName.parse(name)
            if not segment.is_segment:
                continue
            owner = await self.resources.owner(segment)
            if owner is None or owner == self.broker_url:
                continue
            if await self.resources.web_service_url(owner) is not None:
                continue                        # a running broker's (registered): not ours to take
            if await self.resources.move_owner(segment, owner, self.broker_url):
                log.info("scalable topics: segment %s, stored here, was owned by %s (not running): now by %s",
                         name, owner, self.broker_url)

    async def _ensure_session(self) -> Session:
        async with self._session_lock:
            if self._session is None or not self._session.alive:
                self._session = await self.store.create_session(self.session_ttl)
                self._session.add_listener(self._session_ended)
                if self.web_service_url:        # other brokers route segment operations here
                    await self.resources.register_broker(self.broker_url, self.web_service_url, self._session)
            return self._session

    def _session_ended(self, session: Session) -> None:
        if session is not self._session:
            return
        log.warning("scalable topics: metadata session of %s ended; dropping %d controllers",
                    self.broker_url, len(self.controllers))
        for controller in self.controllers.values():
            controller.abandon(tell=True)       # its leadership is gone with the session
        self.controllers.clear()
        if session.state == "expired" and self.web_service_url and not self._closed and self._renewing is None:
            # The broker's registration went with the session: written again only by a new
            # controller, a broker holding segments but none stayed "not running" for the
            # other brokers (their operations on its segments failed) for good.
            self._renewing = asyncio.get_running_loop().create_task(self._renew_session(),
                                                                     name="scalable-session-renewal")

    async def _renew_session(self) -> None:
        """Open a new session (and register the broker with it), retried while the store
        cannot be reached."""
        delay = 0.05
        try:
            while not self._closed:
                try:
                    await self._ensure_session()
                    return
                except Exception as exc:
                    log.warning("scalable topics: a new metadata session for %s failed (retried): %s",
                                self.broker_url, exc)
                await asyncio.sleep(delay)
                delay = min(2 * delay, self.session_ttl)
        finally:
            self._renewing = None

    # --- controllers ------------------------------------------------------------------------

    async def controller(self, topic: str | TopicName) -> ScalableTopicController:
        """This broker's controller of `topic` (created and initialized on first use)."""
        if self._closed:
            raise NotAllowedError("the scalable topic service is closed")
        name = scalable_topic_name(topic)
        key = str(name)
        controller = self.controllers.get(key)
        if controller is not None:
            return controller
        creating = self._creating.get(key)
        if creating is None:
            creating = asyncio.ensure_future(self._create_controller(name, key))
            self._creating[key] = creating
            # retrieved here: every caller may have been cancelled meanwhile
            creating.add_done_callback(lambda done: done.cancelled() or done.exception())
        # shielded: a caller cancelled (its connection closed) must not cancel the creation
        # the other callers wait for
        return await asyncio.shield(creating)

    async def _create_controller(self, name: TopicName, key: str) -> ScalableTopicController:
        try:
            controller = await self._new_controller(name)
        except Exception as error:
            if self._closed:            # its session closed under it
                raise NotAllowedError("the scalable topic service is closed") from error
            raise
        finally:
            del self._creating[key]
        if self._closed:
            # created while the service closed: close() did not see it, and kept it would
            # stand for election for a broker that is gone
            await controller.close()
            raise NotAllowedError("the scalable topic service is closed")
        self.controllers[key] = controller
        return controller

    async def _new_controller(self, name: TopicName) -> ScalableTopicController:
        session = await self._ensure_session()
        controller = ScalableTopicController(name, self.resources, self.segments, self.broker_url, session,
                                             grace_period=self.grace_period, fault=self.fault)
        try:
            await controller.initialize()
        except BaseException:
            await controller.close()
            raise
        return controller

    async def release(self, topic: str | TopicName, *, deleted: bool = False) -> None:
        """Close this broker's controller of `topic`. Its connected consumers are told to find
        the leader again, or (`deleted`) that the topic is gone, so that they stop."""
        key = str(scalable_topic_name(topic))
        creating = self._creating.get(key)
        if creating is not None:
            # Created after this, it would be kept and stand for election for a deleted topic:
            # its creation ends first, and its controller is closed here.
            await asyncio.wait([creating])
        controller = self.controllers.pop(key, None)
        if controller is not None:
            tell = TopicNotFoundError(f"scalable topic {controller.topic} was deleted") if deleted else None
            await controller.close(tell)

    # --- topics -------------------------------------------------------------------------------

    async def create_topic(self, topic: str | TopicName, num_segments: int = 1,
                           properties: dict[str, str] | None = None) -> SegmentLayout:
        """Write the initial layout (epoch 0, `num_segments` equal ranges) then create the
        segment topics (Pulsar's order: a crash in between leaves segments that are created on
        first use)."""
        name = scalable_topic_name(topic)
        layout = SegmentLayout.initial(num_segments, properties)
        await self.resources.create(name, layout)
        for segment in layout.active_segments:
            await self.segments.create(segment.topic_name(name), [], incarnation=layout.incarnation)
        return layout

    async def delete_topic(self, topic: str | TopicName) -> None:
        """Delete the topic's incarnation found first, and nothing of another: a delete that
        paused while the topic was deleted and created again ends with ScalableTopicNotFoundError
        (resources.py, the deleting marker). The broker the request reached deletes, whether it
        leads the topic or not: the leader's creates are fenced by the marker at the segments'
        brokers."""
        name = scalable_topic_name(topic)
        layout, _ = await self.resources.load(name)              # ScalableTopicNotFoundError
        incarnation = layout.incarnation
        await self.resources.mark_deleting(name, incarnation)    # the segments' brokers may now delete them
        await self.release(name, deleted=True)  # once marked: a late delete keeps the new topic's controller
        # read once marked (no segment is created any more), the operation before the layout (as
        # keeps_segment): every segment created is in one of them, the children of a split or
        # merge in progress too
        operation = await self.resources.pending_operation(name)
        layout, _ = await self.resources.load_incarnation(name, incarnation)
        segments = dict(layout.all_segments)
        if operation is not None:
            target = operation.target_layout
            segments.update({child: target.segment(child) for child in operation.child_ids})
        for segment in segments.values():
            # the segments' brokers refuse to delete a segment of a newer incarnation (not marked);
            # stop sending them once there is one
            if not await self.resources.is_deleting(name, incarnation):
                raise ScalableTopicNotFoundError(f"scalable topic {name} was deleted and created again")
            try:
                await self.segments.delete(segment.topic_name(name))
            except Exception:            # best effort, as Pulsar
                log.exception("deleting segment %s of %s failed", segment.segment_id, name)
        await self._delete_schemas(name, incarnation)
        await self.resources.delete(name, incarnation)

    async def _delete_schemas(self, name: TopicName, incarnation: str | None) -> None:
        """The topic's schemas go before its record, as Pulsar orders it: a crash in between
        leaves the topic marked, and a retried delete finishes; the other order left them to a
        topic created again under the name. Checked under the schema's lock that the marked
        incarnation is still the topic's or its tombstone (a delete that paused while the
        topic was deleted and created again must not take the new topic's schema)."""
        broker = self._local_broker()
        if broker is None:
            return
        async with broker.schemas.registry.deleting(schema_id(name)) as delete:
            if not await self.resources.is_deleting(name, incarnation):
                raise ScalableTopicNotFoundError(f"scalable topic {name} was deleted and created again")
            await broker.env.submit(delete)

    def _local_broker(self) -> Any:
        """The BrokerService whose data dir holds this broker's segments (None: segments only
        elsewhere, as in tests of the controller alone)."""
        return getattr(getattr(self.segments, "local", self.segments), "broker", None)

    async def list_topics(self, namespace: str) -> list[str]:
        return await self.resources.list(namespace)

    async def get_layout(self, topic: str | TopicName) -> SegmentLayout:
        layout, _ = await self.resources.load(scalable_topic_name(topic))
        return layout

    async def leader_url(self, topic: str | TopicName) -> str | None:
        record = await self.store.get(self.resources.controller_path(scalable_topic_name(topic)))
        return record.value.decode() if record is not None else None

    async def leader(self, topic: str | TopicName, timeout: float = 0.0) -> ScalableTopicController:
        """This broker's controller of `topic` if it leads (or comes to lead within `timeout`
        seconds), else NotLeaderError naming the leader."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        controller = await self.controller(topic)
        while not controller.is_leader and (remaining := deadline - loop.time()) > 0:
            try:
                await controller.wait_leading(remaining)
            except TimeoutError:
                break
            except NotLeaderError:
                # dropped with its session (or released): the next one stands on a new session
                closed, controller = controller, await self.controller(topic)
                if controller is closed:
                    break
        if not controller.is_leader:
            raise NotLeaderError(controller.topic, controller.leader_url)
        return controller

    async def split_segment(self, topic: str | TopicName, segment_id: int) -> SegmentLayout:
        return await (await self.leader(topic)).split_segment(segment_id)

    async def merge_segments(self, topic: str | TopicName, segment_id1: int, segment_id2: int) -> SegmentLayout:
        return await (await self.leader(topic)).merge_segments(segment_id1, segment_id2)

    # --- lifecycle ----------------------------------------------------------------------------

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._stop_renewing()
        for controller in list(self.controllers.values()):
            try:
                await controller.close()
            except Exception:
                # the others still close, and so does the session, which takes the records
                # the store failed to delete (its election record) with it
                log.exception("closing the controller of %s failed", controller.topic)
        self.controllers.clear()
        if self._session is not None:
            self._session.remove_listener(self._session_ended)
            await self._session.close()
        close = getattr(self.segments, "close", None)
        if close is not None:
            await close()

    async def _stop_renewing(self) -> None:
        if self._renewing is not None:
            self._renewing.cancel()
            await asyncio.gather(self._renewing, return_exceptions=True)

    def crash(self) -> None:
        """Stop as a killed broker would (tests): controllers stop, the session is left to
        expire in the store."""
        self._closed = True
        if self._renewing is not None:
            self._renewing.cancel()
        for controller in self.controllers.values():
            controller.abandon()
        self.controllers.clear()
        if self._session is not None:
            self._session.remove_listener(self._session_ended)
            self._session.abandon()


__all__ = ["ScalableTopicNotFoundError", "ScalableTopicService", "scalable_topic_name"]
