"""Leftovers of the child-segment fencing (segments.py, LocalSegments): a refused create leaves
no owner record, a late create after the topic's deletion is refused (its tombstone), the topic's
deletion takes the children of a split in progress along, and the fence lock is per segment."""

import asyncio

import pytest

from pyengine.admin import AdminServer
from pyengine.broker.service import BrokerConfig, BrokerService
from pyengine.errors import PulsarError
from pyengine.metadata.memory_store import MemoryMetadataStore
from pyengine.naming import TopicName
from pyengine.scalable.resources import ScalableTopicResources
from pyengine.scalable.segments import LocalSegments, RoutedSegments, SegmentFencedError
from pyengine.scalable.service import ScalableTopicService, scalable_topic_name
from tests.scalable.conftest import SEGMENTS_BROKER_URL, TOPIC, Held
from tests.scalable.test_child_segment_fencing import CHILD, deposed

PARENT = "segment://public/default/orders/0000-ffff-0"
SECOND_CHILD = "segment://public/default/orders/8000-ffff-2"


@pytest.fixture
async def routed(broker, store):
    """`make(name)`: a started ScalableTopicService whose segment operations go through
    RoutedSegments (claim the owner, then create), as a broker's; all on the one broker."""
    made = []

    async def make(name, **kwargs):
        url = f"pulsar://{name}:6650"
        resources = ScalableTopicResources(store)
        segments = RoutedSegments(LocalSegments(broker.service, url), resources, url)
        service = await ScalableTopicService(store, segments, url, session_ttl=0.5, **kwargs).start()
        made.append(service)
        return service

    yield make
    for service in made:
        await service.close()


async def test_a_refused_create_leaves_no_owner_record(broker, routed):
    a = await routed("a")
    b = await routed("b")
    await a.create_topic(TOPIC, 1)
    # one broker under two names: with no owner record, each takes the parent for its own
    await a.resources.forget_owner(TopicName.parse(PARENT))
    leader = await a.controller(TOPIC)
    await b.controller(TOPIC)
    leader.segments = held = Held(leader.segments, "create")

    split = asyncio.ensure_future(a.split_segment(TOPIC, 0))
    await asyncio.wait_for(held.sent.wait(), 5)          # A is about to claim child 1's owner, then create it
    await deposed(a, b)                                  # B rolled the split back
    held.land.set()
    with pytest.raises(PulsarError):
        await split
    assert not broker.service.topic_exists(CHILD)
    # no stray record naming A: a later create of child 1 places it afresh
    assert await b.resources.owner(TopicName.parse(CHILD)) is None


async def test_a_late_create_after_the_topics_deletion_is_refused(broker, services):
    a = await services("a")
    b = await services("b")
    await a.create_topic(TOPIC, 1)
    leader = await a.controller(TOPIC)
    await leader.create_subscription("sub")
    leader.segments = held = Held(leader.segments, "create")

    split = asyncio.ensure_future(a.split_segment(TOPIC, 0))
    await asyncio.wait_for(held.sent.wait(), 5)          # A sent the create of child 1
    await b.delete_topic(TOPIC)                          # meanwhile the whole topic goes
    held.land.set()                                      # only now does A's create land
    with pytest.raises(PulsarError):
        await split
    assert not broker.service.topic_exists(CHILD)        # refused: no segment of a deleted topic
    assert not [t for t in broker.service.list_topics() if t.startswith("segment://")]
    with pytest.raises(SegmentFencedError, match="deleted"):
        await b.segments.create(SECOND_CHILD, [])
    # the tombstone lists no topic, and goes when the name is used again
    assert await b.list_topics("public/default") == []
    await b.create_topic(TOPIC, 1)
    assert broker.service.topic_exists(PARENT)
    assert not await b.resources.is_deleting(scalable_topic_name(TOPIC))
    # a segment of a name that never was a scalable topic is still made through the Segments API
    await b.segments.create("segment://public/default/raw/0000-ffff-0", [])
    assert broker.service.topic_exists("segment://public/default/raw/0000-ffff-0")


async def test_deleting_the_topic_deletes_the_children_of_a_split_in_progress(broker, services):
    a = await services("a")
    b = await services("b")
    await a.create_topic(TOPIC, 1)
    leader = await a.controller(TOPIC)
    await leader.create_subscription("sub")
    leader.segments = held = Held(leader.segments, "terminate")

    split = asyncio.ensure_future(a.split_segment(TOPIC, 0))
    await asyncio.wait_for(held.sent.wait(), 5)          # both children created, the parent not sealed
    assert broker.service.topic_exists(CHILD) and broker.service.topic_exists(SECOND_CHILD)
    await b.delete_topic(TOPIC)
    held.land.set()
    with pytest.raises(PulsarError):                     # the topic is gone under it
        await split
    assert not [t for t in broker.service.list_topics() if t.startswith("segment://")]


class GatedResources:
    """Resources whose fence check of `segment` waits, once checked, until `open` is set."""

    def __init__(self, resources, segment):
        self.inner = resources
        self.segment = segment
        self.checked = asyncio.Event()
        self.open = asyncio.Event()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def keeps_segment(self, segment):
        kept = await self.inner.keeps_segment(segment)
        if str(segment) == self.segment:
            self.checked.set()
            await self.open.wait()
        return kept


async def test_creates_of_two_segments_do_not_wait_for_each_other(broker, services):
    a = await services("a")
    await a.create_topic(TOPIC, 2)                       # segments 0 (0000-7fff) and 1 (8000-ffff)
    first, second = "segment://public/default/orders/0000-7fff-0", "segment://public/default/orders/8000-ffff-1"
    for segment in (first, second):
        await broker.service.delete_topic(segment)       # as if their creates had not landed yet
    gate = GatedResources(a.resources, first)
    slow = LocalSegments(broker.service, SEGMENTS_BROKER_URL, gate)
    plain = LocalSegments(broker.service, SEGMENTS_BROKER_URL, a.resources)

    stuck = asyncio.ensure_future(slow.create(first, []))
    await asyncio.wait_for(gate.checked.wait(), 5)       # the first create holds its segment's lock
    await asyncio.wait_for(plain.create(second, []), 5)  # the other segment's create goes ahead
    assert broker.service.topic_exists(second)
    again = asyncio.ensure_future(plain.create(first, []))   # the same segment's waits for the lock
    await asyncio.sleep(0.05)
    assert not again.done() and not stuck.done()
    gate.open.set()
    await asyncio.wait_for(asyncio.gather(stuck, again), 5)
    assert broker.service.topic_exists(first)


@pytest.fixture
async def two_brokers(tmp_path):
    """Brokers a and b (each with its admin API) on one metadata store."""
    store = await MemoryMetadataStore().start()
    brokers = []
    for name in ("a", "b"):
        service = BrokerService(BrokerConfig(data_dir=tmp_path / name, sync=False, num_coordinators=1,
                                             metadata_store=store, scalable_session_ttl=0.5))
        await service.start()
        admin = AdminServer(service, port=0)
        await admin.start()
        service.service_url = f"pulsar://{name}:6650"
        service.web_service_url = admin.url
        brokers.append((service, admin))
    yield store, brokers[0][0], brokers[1][0]
    for service, admin in brokers:
        await admin.stop()
        await service.close()
    await store.close()


async def test_a_remote_delete_of_an_absent_segment_waits_for_a_create_in_flight_at_its_owner(two_brokers):
    store, a, b = two_brokers
    on_a = await a.scalable_topics()
    on_b = await b.scalable_topics()
    await on_b.create_topic(TOPIC, 1)                    # segment 0 on b: the children go there too
    leader = await on_a.controller(TOPIC)
    assert leader.is_leader
    # a third controller, on a: its deletes of b's segments are remote
    url = "pulsar://c:6650"
    resources = ScalableTopicResources(store)
    third = await ScalableTopicService(store, RoutedSegments(LocalSegments(a, url), resources, url), url,
                                       session_ttl=0.5).start()
    try:
        await third.controller(TOPIC)
        local_b = on_b.segments.local
        gate = local_b.resources = GatedResources(local_b.resources, CHILD)
        deleted = asyncio.Event()
        delete = local_b.delete

        async def delete_seen(segment):
            deleted.set()
            await delete(segment)
        local_b.delete = delete_seen

        split = asyncio.ensure_future(on_a.split_segment(TOPIC, 0))
        await asyncio.wait_for(gate.checked.wait(), 5)   # A's create of child 1 passed b's check, not done
        on_a._session.abandon()                          # A is deposed: the third rolls the split back
        takeover = asyncio.ensure_future(third.controller(TOPIC))
        recovered = asyncio.ensure_future((await takeover).wait_leading(timeout=5))
        done, _ = await asyncio.wait({recovered, asyncio.ensure_future(deleted.wait())}, timeout=5,
                                     return_when=asyncio.FIRST_COMPLETED)
        assert done
        gate.open.set()                                  # A's create completes at b
        await asyncio.wait_for(recovered, 5)
        with pytest.raises(PulsarError):
            await split
        assert await third.resources.pending_operation(scalable_topic_name(TOPIC)) is None
        # the rollback's delete reached b and acted after the create: no leftover child, no record
        assert not b.topic_exists(CHILD)
        assert await third.resources.owner(TopicName.parse(CHILD)) is None
    finally:
        await third.close()


async def test_no_segment_is_created_while_its_topic_is_being_deleted(broker, services):
    a = await services("a")
    layout = await a.create_topic(TOPIC, 1)
    await broker.service.delete_topic(PARENT)            # the deletion reached segment 0 first...
    await a.resources.mark_deleting(scalable_topic_name(TOPIC), layout.incarnation)
    with pytest.raises(SegmentFencedError, match="deleted"):
        await a.segments.create(PARENT, [])              # ... a late create of it is refused all the same
    assert not broker.service.topic_exists(PARENT)
