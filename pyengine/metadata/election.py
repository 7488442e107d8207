"""Leader election on a metadata store (Pulsar's `LeaderElection`), built on ephemeral records.

A candidate campaigns by creating the election path (create-if-absent) as an ephemeral record
of its session, holding its `candidate_id` (for a scalable-topic controller: the broker's
service URL). The store's create-if-absent makes exactly one candidate the leader; the others
follow it and watch the path. When the leader resigns, or its session is closed or expires (a
crashed broker stops refreshing it), the record disappears and the followers campaign again.

While leading, `leader_revision` is the mod revision of its record: with `path`, the guard of
the leader's writes (`MetadataStore.put(..., guard_path=, guard_mod_revision=)`). The local view
can lag the store (a paused process still believes it leads); a guarded write cannot: once
another candidate's record replaced ours, or ours is gone, every guarded write is refused.

A candidate whose own session ends leaves the election (state `NO_LEADER`): its session was
local proof of its leadership, and the store drops its record at the same time or later, so a
leader always knows it has lost leadership no later than another candidate can win. To
stand again it needs a new session and a new `LeaderElection`.

`resign()` removes the record its campaign wrote, whatever the local view: a create still in
flight is waited for first (it may be written even though the campaign is stopped), and a
create whose reply was lost left a record the local view never saw. A record of the same
session written by another election on the path (a broker's next controller of a topic) is
left alone when ours is known by its create revision.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from pyengine.metadata import (
    AlreadyExistsError,
    BadVersionError,
    CompactedError,
    LeaderState,
    MetadataStore,
    MetadataStoreError,
    NotFoundError,
    NotificationType,
    Record,
    Session,
    SessionExpiredError,
    Watch,
    check_path,
)

log = logging.getLogger(__name__)

RETRY_DELAY = 0.2      # after the store failed (unreachable): seconds before campaigning again

Listener = Callable[[LeaderState, "str | None"], None]


class LeaderElection:
    """`campaign()` to stand; `state` / `leader` / `is_leader` for the local view (kept up to
    date by a watch); `leader_revision` the mod revision of our record while leading (the
    guard of the leader's writes); `current_leader()` reads the store; `wait_for(state)` and
    listeners (`add_listener(fn(state, leader))`) observe changes; `resign()` steps down and
    stops."""

    def __init__(self, store: MetadataStore, path: str, candidate_id: str, *, session: Session) -> None:
        check_path(path)
        if not isinstance(candidate_id, str) or not candidate_id:
            raise TypeError("candidate_id is a non-empty str")
        if not isinstance(session, Session):
            raise TypeError("session is a Session")
        if isinstance(store, MetadataStore) and session.store is not store:
            # every write with it would be refused: refused here, not in the background (a
            # wrapper of a store is not checked here: its store refuses the first attempt,
            # which campaign() raises)
            raise ValueError("the session belongs to another metadata store")
        self.store = store
        self.path = path
        self.candidate_id = candidate_id
        self.session = session
        self.state = LeaderState.NO_LEADER
        self.leader: str | None = None
        self.leader_revision: int | None = None     # of our record, while LEADING
        self._listeners: list[Listener] = []
        self._changed = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._first: asyncio.Future | None = None
        self._creating: asyncio.Future | None = None    # the create of our record in flight
        # what resign() deletes: the record our last create wrote (its create revision), or
        # any record of our session when a create failed without an answer (it may be written)
        self._written: int | None = None
        self._maybe_written = False
        self._stopped = False

    @property
    def is_leader(self) -> bool:
        return self.state is LeaderState.LEADING

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    async def campaign(self) -> LeaderState:
        """Stand for election (once; later calls just report). Returns the state after the
        first attempt: LEADING or FOLLOWING; the election then runs in the background. If the
        first attempt fails, its error is raised (here and by later calls): `resign()` then,
        which also removes a record the failed attempt may have written."""
        if self._stopped:
            raise MetadataStoreError("this election was resigned or its session ended")
        if self._task is None and not self.session.alive:
            # its listener would never be called, nor the first attempt made: no wait forever
            raise SessionExpiredError(f"session {self.session.id:x} is {self.session.state}")
        if self._task is None:
            self._first = asyncio.get_running_loop().create_future()
            self.session.add_listener(self._session_ended)
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"election {self.path}")
        assert self._first is not None
        await asyncio.shield(self._first)
        return self.state

    async def wait_for(self, state: LeaderState, timeout: float | None = None) -> None:
        """Wait until the local view is `state` (TimeoutError after `timeout` seconds)."""
        async def wait() -> None:
            while self.state is not state:
                await self._changed.wait()
        await asyncio.wait_for(wait(), timeout)

    async def current_leader(self) -> str | None:
        """The leader's candidate id, read from the store (None: no leader right now)."""
        record = await self.store.get(self.path)
        return record.value.decode() if record is not None else None

    async def resign(self) -> None:
        """Step down and stop campaigning: the record at the path is deleted if it is our
        session's, whatever the local view (a create in flight is waited for first)."""
        if self._stopped:
            return
        self._stopped = True
        self.session.remove_listener(self._session_ended)
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        try:
            creating = self._creating
            if creating is not None:
                # not cancelled with the campaign: it may be written anyway (LMDB's commit,
                # etcd's request already sent), so its outcome is waited for, and noted here
                # (done, its callback may not have run yet)
                await asyncio.wait([creating])
                self._created(creating)
            if (self._written is not None or self._maybe_written) and self.session.alive:
                await self._delete_own_record()
        finally:
            # stopped either way: a record the store failed to delete goes with the session
            self._set(LeaderState.NO_LEADER, None)

    close = resign

    # --- internals --------------------------------------------------------------------------

    async def _delete_own_record(self) -> None:
        """Delete the record at the path if our campaign wrote it (only that version of it)."""
        for _ in range(10):
            record = await self.store.get(self.path)
            if record is None or record.session_id != self.session.id:
                return
            if not self._maybe_written and record.create_revision != self._written:
                return              # another election's of our session
            try:
                await self.store.delete(self.path, record.version, expected_mod_revision=record.mod_revision)
                return
            except NotFoundError:
                return
            except BadVersionError:
                continue            # changed since the read: look again
        log.warning("leader election on %s: could not delete our record (it keeps changing); "
                    "it goes with the session", self.path)

    async def _create(self) -> Record:
        """Create our record. Not cancelled with the campaign (`resign()` waits for it)."""
        creating = asyncio.ensure_future(self.store.create(self.path, self.candidate_id.encode(),
                                                            session=self.session))
        creating.add_done_callback(self._created)
        self._creating = creating
        return await asyncio.shield(creating)

    def _created(self, creating: asyncio.Future) -> None:
        """Note what a create wrote (retrieving its outcome: nobody may await it once the
        campaign is cancelled)."""
        if creating.cancelled():
            self._maybe_written = True
        elif (failure := creating.exception()) is None:
            self._written = creating.result().create_revision
        elif not isinstance(failure, AlreadyExistsError):
            self._maybe_written = True      # no answer: it may have been written

    def _set(self, state: LeaderState, leader: str | None, revision: int | None = None) -> None:
        if self._first is not None and not self._first.done():
            self._first.set_result(None)
        self.leader_revision = revision if state is LeaderState.LEADING else None
        if state is self.state and leader == self.leader:
            return
        self.state = state
        self.leader = leader
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        for listener in list(self._listeners):
            try:
                listener(state, leader)
            except Exception:
                log.exception("leader election listener failed")

    def _observe(self, record: Record) -> None:
        if record.session_id == self.session.id:
            self._set(LeaderState.LEADING, self.candidate_id, record.mod_revision)
        else:
            self._set(LeaderState.FOLLOWING, record.value.decode(errors="replace"))

    def _session_ended(self, _session: Session) -> None:
        self._stopped = True
        if self._task is not None:
            self._task.cancel()
        self._set(LeaderState.NO_LEADER, None)

    async def _run(self) -> None:
        while not self._stopped and self.session.alive:
            watch: Watch | None = None
            try:
                # watch first: the deletion of the leader record cannot slip between the
                # attempt and the watch
                watch = await self.store.watch(self.path)
                while not self._stopped:
                    try:
                        record = await self._create()
                    except AlreadyExistsError:
                        current = await self.store.get(self.path)
                        if current is None:
                            continue            # deleted in between: campaign again
                        record = current
                    self._observe(record)
                    async for notification in watch:
                        if notification.revision <= record.mod_revision:
                            # a change from before the state just observed (the watch was
                            # opened first): stale, and acting on it would flap the state
                            continue
                        if notification.type is NotificationType.DELETED:
                            if self.state is LeaderState.LEADING:
                                self._set(LeaderState.NO_LEADER, None)
                            break
                        assert notification.record is not None
                        self._observe(notification.record)
                    else:
                        return          # the watch was closed (store closing)
            except asyncio.CancelledError:
                raise
            except SessionExpiredError:
                self._session_ended(self.session)
                return
            except (MetadataStoreError, CompactedError) as exc:
                log.warning("leader election on %s: %s; retrying", self.path, exc)
                if self._first is not None and not self._first.done():
                    self._first.set_exception(exc)
                    return
                await asyncio.sleep(RETRY_DELAY)
            except Exception as exc:
                # not a store failure (a bug): the first attempt's error goes to campaign()'s
                # caller (else it would wait forever); later, the election goes on
                if self._first is not None and not self._first.done():
                    self._first.set_exception(exc)
                    return
                log.exception("leader election on %s failed; retrying", self.path)
                await asyncio.sleep(RETRY_DELAY)
            finally:
                if watch is not None:
                    watch.close()
