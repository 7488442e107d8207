"""Scalable topics on the wire (PIP-468): DAG watch sessions (commands 70-72) and the
registration of ordered consumers with the controller leader (73-75, the project's extension).

SCALABLE_TOPIC_LOOKUP{session_id, topic} opens a session (any broker serves it, from the
metadata store); the broker answers SCALABLE_TOPIC_UPDATE{session_id, dag} with the whole DAG
and pushes another on every layout or controller change. A session id already open on the
connection, a malformed name or a topic that does not exist is answered by one update with
`error` (and the session is not opened). SCALABLE_TOPIC_CLOSE{session_id} closes it (nothing
is answered; an unknown id is ignored, as Pulsar ignores closing what is not open); closing
the connection closes all of them.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from pyengine.errors import (
    InvalidTopicNameError,
    NotAllowedError,
    PulsarError,
    ServiceNotReadyError,
    TopicNotFoundError,
    to_pulsar_error,
)
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.naming import TopicName
from pyengine.protocol import replies
from pyengine.protocol.replies import encode_command
from pyengine.scalable.controller import ScalableTopicController
from pyengine.scalable.coordinator import AssignmentListener, ConsumerAssignment
from pyengine.scalable.layout import SegmentLayout
from pyengine.scalable.resources import ScalableTopicNotFoundError
from pyengine.scalable.service import scalable_topic_name
from pyengine.scalable.watch import DagWatchSession
from pyengine.scalable.wire import layout_to_dag

if TYPE_CHECKING:
    from pyengine.protocol.connection import ServerConnection

log = logging.getLogger(__name__)
BaseCommand = pb.BaseCommand
MAX_SESSIONS_PER_CONNECTION = 1000


def scalable_topic_update(session_id: int, layout: SegmentLayout | None = None, controller_url: str | None = None,
                          segment_brokers: dict[int, str] | None = None, *, error: int | None = None,
                          message: str = "") -> bytes:
    cmd = BaseCommand(type=BaseCommand.SCALABLE_TOPIC_UPDATE)
    body = cmd.scalableTopicUpdate
    body.session_id = session_id
    if layout is not None:
        layout_to_dag(layout, controller_url, segment_brokers or {}, body.dag)
    if error is not None:
        body.error = error
        body.message = message
    return encode_command(cmd.SerializeToString())


def consumer_assignment(consumer_id: int, assignment: ConsumerAssignment | None = None, *,
                        request_id: int | None = None, error: int | None = None, message: str = "") -> bytes:
    cmd = BaseCommand(type=BaseCommand.SCALABLE_CONSUMER_ASSIGNMENT)
    body = cmd.scalableConsumerAssignment
    body.consumer_id = consumer_id
    if request_id is not None:
        body.request_id = request_id
    if assignment is not None:
        body.layout_epoch = assignment.layout_epoch
        for segment in assignment.assigned_segments:
            item = body.segments.add()
            item.segment_id = segment.segment_id
            item.hash_start, item.hash_end = segment.hash_range.start, segment.hash_range.end
            item.topic = segment.topic
    if error is not None:
        body.error = error
        body.message = message
    return encode_command(cmd.SerializeToString())


class _Opening:
    """The place of a DAG watch session being opened."""


class ScalableTopicCommands:
    """The DAG watch sessions and ordered-consumer registrations of one connection."""

    def __init__(self, connection: ServerConnection) -> None:
        self.connection = connection
        self.sessions: dict[int, DagWatchSession | _Opening] = {}
        # consumer id -> (controller, subscription, consumer name)
        # consumer id -> its controller, subscription, name and the listener it registered
        # with (which tells this registration apart from a later one of the same name)
        self.consumers: dict[int, tuple[ScalableTopicController, str, str, AssignmentListener]] = {}
        # consumer ids being registered -> whether their UNREGISTER came meanwhile (the client
        # gave up): such a registration is undone once made, or it would hold segments nobody
        # reads (and, its entry gone, never be disconnected). A second REGISTER of one is refused.
        self._registering: dict[int, bool] = {}

    async def register_consumer(self, body: pb.CommandScalableConsumerRegister) -> None:
        consumer_id = body.consumer_id
        if consumer_id in self.consumers or consumer_id in self._registering:
            error = NotAllowedError(f"consumer {consumer_id} is already registered on this connection")
            self.connection.write(consumer_assignment(consumer_id, request_id=body.request_id,
                                                      error=error.server_error, message=str(error)))
            return
        self._registering[consumer_id] = False      # before any await: a second REGISTER sees it
        try:
            await self._register_consumer(body)
        finally:
            del self._registering[consumer_id]

    async def _register_consumer(self, body: pb.CommandScalableConsumerRegister) -> None:
        consumer_id, request_id = body.consumer_id, body.request_id
        try:
            if "://" not in body.topic:
                raise InvalidTopicNameError(f"a scalable topic is named topic://tenant/namespace/topic, "
                                            f"not {body.topic!r}")
            topic = scalable_topic_name(body.topic)
            service = await self.connection.service.scalable_topics()
            controller = await service.leader(topic)

            def push(assignment: ConsumerAssignment | PulsarError) -> None:
                if self.consumers.get(consumer_id, (None,))[0] is not controller or self.connection.closed:
                    return
                if isinstance(assignment, PulsarError):     # no longer served by this controller
                    self.consumers.pop(consumer_id, None)
                    self.connection.write(consumer_assignment(consumer_id, error=assignment.server_error,
                                                              message=str(assignment)))
                else:
                    self.connection.write(consumer_assignment(consumer_id, assignment))

            self.consumers[consumer_id] = (controller, body.subscription, body.consumer_name, push)
            try:
                assignment = await controller.register_consumer(body.subscription, body.consumer_name,
                                                                consumer_id, push, self._alive)
            except BaseException:
                self.consumers.pop(consumer_id, None)
                raise
        except Exception as exc:
            if isinstance(exc, ScalableTopicNotFoundError):
                exc = TopicNotFoundError(str(exc))
            error = to_pulsar_error(exc)
            self.connection.write(consumer_assignment(consumer_id, request_id=request_id, error=error.server_error,
                                                      message=str(error)))
            return
        if self.connection.closed:
            controller.consumer_disconnected(body.subscription, body.consumer_name, push)
            return
        if self._registering[consumer_id]:          # unregistered by the client meanwhile
            self.consumers.pop(consumer_id, None)
            try:
                await controller.unregister_consumer(body.subscription, body.consumer_name, push)
            except Exception as exc:        # not the leader any more: the grace period evicts it
                log.info("unregistering consumer %s: %s", body.consumer_name, exc)
            error = ServiceNotReadyError(f"consumer {consumer_id} was unregistered before its registration "
                                         "was complete")
            self.connection.write(consumer_assignment(consumer_id, request_id=request_id, error=error.server_error,
                                                      message=str(error)))
            return
        self.connection.write(consumer_assignment(consumer_id, assignment, request_id=request_id))

    async def _alive(self) -> bool:
        """Whether this connection still answers a PING; if not it is closed (another
        connection takes its consumer names over, as a producer name is taken over)."""
        connection = self.connection
        if await connection.check_liveness(connection.server.liveness_timeout):
            return True
        log.info("%s: closing a silent connection whose consumer name another connection registers", connection.peer)
        connection.close()
        return False

    async def unregister_consumer(self, body: pb.CommandScalableConsumerUnregister) -> None:
        if body.consumer_id in self._registering:
            self._registering[body.consumer_id] = True      # undone by its registration once made
            return
        registered = self.consumers.pop(body.consumer_id, None)
        if registered is not None:
            controller, subscription, name, listener = registered
            try:
                await controller.unregister_consumer(subscription, name, listener)
            except Exception as exc:        # not the leader any more: the grace period evicts it
                log.info("unregistering consumer %s: %s", name, exc)

    async def lookup(self, body: pb.CommandScalableTopicLookup) -> None:
        session_id = body.session_id
        if session_id in self.sessions:
            self._refuse(session_id, NotAllowedError(f"DAG watch session {session_id} is already open"))
            return
        if len(self.sessions) >= MAX_SESSIONS_PER_CONNECTION:
            self._refuse(session_id, NotAllowedError(f"at most {MAX_SESSIONS_PER_CONNECTION} DAG watch sessions "
                                                     "per connection"))
            return
        # This open's own placeholder: a CLOSE and a LOOKUP of the same id meanwhile replace it,
        # and then neither this session nor its failure is the client's any more.
        opening = self.sessions[session_id] = _Opening()
        session: DagWatchSession | None = None

        def current() -> bool:
            entry = self.sessions.get(session_id)
            return entry is opening or (entry is not None and entry is session)

        try:
            topic = scalable_topic_name(body.topic)
            if "://" not in body.topic:
                raise InvalidTopicNameError(f"a scalable topic is named topic://tenant/namespace/topic, "
                                            f"not {body.topic!r}")
            service = await self.connection.service.scalable_topics()
            segments = service.segments

            def push(layout: SegmentLayout, controller_url: str | None, brokers: dict[int, str]) -> None:
                if current():                           # (the first update comes while opening)
                    self.connection.write(scalable_topic_update(session_id, layout, controller_url, brokers))

            async def resolve(layout: SegmentLayout) -> dict[int, str]:
                return {s.segment_id: await segments.owner_url(s.topic_name(topic)) for s in layout.active_segments}

            def ended(error: BaseException) -> None:
                # Also while opening (the topic deleted before its first read): else the
                # client hears nothing and its id stays taken by the placeholder.
                if current():
                    del self.sessions[session_id]
                    self._refuse(session_id, error)

            session = DagWatchSession(service.resources, topic, push, ended, resolve)
            await session.start()
        except Exception as exc:
            if current():
                del self.sessions[session_id]
                self._refuse(session_id, exc)
            return
        if self.sessions.get(session_id) is opening and not self.connection.closed and not session.ended:
            self.sessions[session_id] = session
        else:
            session.close()

    async def lookup_segment(self, body: pb.CommandLookupTopic) -> None:
        """LOOKUP of a segment:// topic: the broker that owns it (its data is on that broker's
        disk), this one when it owns it or no owner is recorded yet."""
        try:
            service = await self.connection.service.scalable_topics()
            owner = await service.resources.owner(TopicName.parse(body.topic))
        except Exception as exc:
            error = to_pulsar_error(exc)
            self.connection.write(replies.lookup_failed(body.request_id, error.server_error, str(error)))
            return
        url = owner if owner is not None and owner != service.broker_url else self.connection.broker_url
        self.connection.write(replies.lookup_connect(body.request_id, url))

    def close_session(self, body: pb.CommandScalableTopicClose) -> None:
        session = self.sessions.pop(body.session_id, None)
        if isinstance(session, DagWatchSession):
            session.close()

    def _refuse(self, session_id: int, exc: BaseException) -> None:
        if isinstance(exc, ScalableTopicNotFoundError):
            exc = TopicNotFoundError(str(exc))
        error = to_pulsar_error(exc)
        self.connection.write(scalable_topic_update(session_id, error=error.server_error, message=str(error)))

    def connection_closed(self) -> None:
        for session in self.sessions.values():
            if isinstance(session, DagWatchSession):
                session.close()
        self.sessions.clear()
        for controller, subscription, name, listener in self.consumers.values():
            controller.consumer_disconnected(subscription, name, listener)     # its grace period starts
        self.consumers.clear()
