"""DAG watch sessions (the spec's DagWatchSession): any broker serves them from the metadata
store. A session reads the layout and the controller leader, watches both records, and calls
`on_update(layout, controller_url, segment_brokers)` first with the current state and again after every change
(each epoch or leader change once; a change of neither is not repeated). When the topic is
deleted, `on_error` is called once and the session ends.

The watches start from the revision of the first read, so no change between the read and the
watch is missed (the metadata store's `since`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from pyengine.metadata import Watch
from pyengine.naming import TopicName
from pyengine.scalable.layout import SegmentLayout
from pyengine.scalable.resources import ScalableTopicNotFoundError, ScalableTopicResources

log = logging.getLogger(__name__)

UpdateListener = Callable[[SegmentLayout, "str | None", "dict[int, str]"], None]
BrokerResolver = Callable[[SegmentLayout], Awaitable["dict[int, str]"]]
ErrorListener = Callable[[BaseException], None]


class DagWatchSession:
    def __init__(self, resources: ScalableTopicResources, topic: TopicName, on_update: UpdateListener,
                 on_error: ErrorListener, resolve_brokers: BrokerResolver | None = None) -> None:
        self.resources = resources
        self.resolve_brokers = resolve_brokers
        self.topic = topic
        self.on_update = on_update
        self.on_error = on_error
        self.layout: SegmentLayout | None = None
        self.controller_url: str | None = None
        self._watch: Watch | None = None
        self._task: asyncio.Task | None = None
        self._closed = False

    async def start(self) -> None:
        """Read, push the first update, then follow changes (ScalableTopicNotFoundError if the
        topic does not exist)."""
        store = self.resources.store
        page = await store.list_prefix(self.resources.topic_path(self.topic) + "/controller")
        revision = page.revision            # the reads below come after it: nothing is missed
        if not await store.exists(self.resources.topic_path(self.topic)):
            raise ScalableTopicNotFoundError(f"scalable topic {self.topic} does not exist")
        # one prefix watch covers the layout record and the controller lock below it
        self._watch = await store.watch(self.resources.topic_path(self.topic), prefix=True, since=revision)
        try:
            await self._refresh()
        except BaseException:
            self.close()            # the caller never gets the session: nothing else would close it
            raise
        self._task = asyncio.get_running_loop().create_task(self._follow(), name=f"dag watch {self.topic}")

    async def _refresh(self) -> bool:
        try:
            layout, _ = await self.resources.load(self.topic)
        except ScalableTopicNotFoundError as error:
            self._end(error)
            return False
        if self.layout is not None and layout.incarnation != self.layout.incarnation:
            # deleted and created again before this re-read: the watched topic is gone (its
            # successor's epochs start again at 0, so the epoch check below would not see it)
            self._end(ScalableTopicNotFoundError(f"scalable topic {self.topic} was deleted"))
            return False
        leader = await self.resources.store.get(self.resources.controller_path(self.topic))
        url = leader.value.decode() if leader is not None else None
        if self.layout is not None and layout.epoch == self.layout.epoch and url == self.controller_url:
            return True
        self.layout, self.controller_url = layout, url
        brokers = await self.resolve_brokers(layout) if self.resolve_brokers is not None else {}
        if not self._closed:
            self.on_update(layout, url, brokers)
        return True

    async def _follow(self) -> None:
        assert self._watch is not None
        relevant = {self.resources.topic_path(self.topic), self.resources.controller_path(self.topic)}
        try:
            async for notification in self._watch:
                if notification.path in relevant and not await self._refresh():
                    return
        except asyncio.CancelledError:
            raise
        except Exception as error:          # the store failed the watch: the client re-opens
            log.warning("DAG watch of %s failed: %s", self.topic, error)
            self._end(error)

    def _end(self, error: BaseException) -> None:
        if not self._closed:
            self._closed = True
            if self._watch is not None:
                self._watch.close()
            self.on_error(error)

    @property
    def ended(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True
        if self._watch is not None:
            self._watch.close()
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
