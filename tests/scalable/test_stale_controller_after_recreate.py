"""A controller that has not yet heard that its topic was deleted (its election's watch lags)
must not write its split into the topic created again under the same name. The new topic's
layout record starts at version 0 again, so a compare-and-set on the version alone let the old
operation land on it (the old incarnation's layout over the new topic); the CAS also compares
the record's mod revision, which is never reused (metadata store, expected_mod_revision)."""

import pytest

from pyengine.metadata import BadVersionError
from pyengine.scalable.resources import PendingOperation
from pyengine.scalable.service import scalable_topic_name
from tests.scalable.conftest import TOPIC
from tests.scalable.test_producer_key_order_across_splits import hold_controller_split

NAME = scalable_topic_name(TOPIC)


async def test_a_controller_late_to_learn_of_a_delete_leaves_the_new_topics_layout_alone(services):
    a = await services("a")
    b = await services("b")
    await a.create_topic(TOPIC, 1)
    leader = await a.controller(TOPIC)
    leader._check_leading = lambda: None          # its election has not heard of the delete yet
    split, go_on = await hold_controller_split(leader, 0)    # the parent sealed, the layout not written yet
    await b.delete_topic(TOPIC)
    new = await b.create_topic(TOPIC, 1)           # its layout record: version 0, as the old one's
    go_on.set()
    with pytest.raises(BadVersionError):
        await split
    layout = await b.get_layout(TOPIC)
    assert (layout.incarnation, layout.epoch, sorted(layout.all_segments)) == (new.incarnation, 0, [0])
    await a.split_segment(TOPIC, 0)                # the new topic goes on (A leads it)
    assert (await b.get_layout(TOPIC)).epoch == 1


async def test_an_operation_record_read_before_a_delete_cannot_move_the_new_topics(services):
    a = await services("a")
    await a.create_topic(TOPIC, 1)
    layout, record = await a.resources.load_record(NAME)
    operation = PendingOperation("split", (0,), layout.epoch, record.version, layout.split_segment(0).to_metadata(),
                                 base_revision=record.mod_revision)
    stale = await a.resources.begin_operation(NAME, operation)
    await a.delete_topic(TOPIC)
    await a.create_topic(TOPIC, 1)
    new_layout, new_record = await a.resources.load_record(NAME)
    fresh = await a.resources.begin_operation(NAME, PendingOperation(
        "split", (0,), 0, new_record.version, new_layout.split_segment(0).to_metadata(),
        base_revision=new_record.mod_revision))
    assert fresh.version == stale.version          # the same version: only the revision tells them apart
    with pytest.raises(BadVersionError):
        await a.resources.advance_operation(NAME, stale, "sealing")
    assert not await a.resources.end_operation(NAME, stale)
    assert await a.resources.pending_operation(NAME) == fresh
    with pytest.raises(BadVersionError):
        await a.resources.update(NAME, layout.split_segment(0), stale.base_version, stale.base_revision)
    assert (await a.resources.load(NAME))[0] == new_layout


def test_an_operation_recorded_before_revisions_reads_without_one():
    operation = PendingOperation("split", (0,), 0, 3, {"epoch": 1}, base_revision=17)
    assert PendingOperation.from_json(operation.to_json(), 2, 40) == operation
    legacy = operation.to_json().replace(b', "baseRevision": 17', b"")
    assert b"baseRevision" not in legacy
    assert PendingOperation.from_json(legacy).base_revision is None
