"""`ManagedLedger.update_properties`: several properties set and deleted in one save of the
topic record (what a topic's admin properties need: all of a request, or none of it)."""

import pytest

from pyengine.storage import ManagedLedger, StorageError

from tests.storage.helpers import fail_next_save

TOPIC = "persistent://public/default/t"


async def test_set_and_deleted_properties_survive_a_restart(env, reopen):
    ml = await ManagedLedger.open(env, TOPIC)
    await ml.update_properties({"a": "1", "b": "2", "c": "3"})
    await ml.update_properties({"b": None, "c": "three", "missing": None})
    assert ml.properties == {"a": "1", "c": "three"}
    await ml.close()
    again = await ManagedLedger.open(reopen(env), TOPIC)
    assert again.properties == {"a": "1", "c": "three"}


async def test_a_refused_value_changes_no_property(env):
    ml = await ManagedLedger.open(env, TOPIC)
    await ml.update_properties({"kept": "yes"})
    with pytest.raises(TypeError):
        await ml.update_properties({"new": "1", "kept": 5})
    with pytest.raises(ValueError, match="UTF-8"):
        await ml.update_properties({"new": "1", "kept": "\ud800"})     # a lone surrogate
    assert ml.properties == {"kept": "yes"}


async def test_properties_whose_save_failed_are_saved_by_the_next_update(env, reopen):
    ml = await ManagedLedger.open(env, TOPIC)
    await ml.update_properties({"gone": "x"})
    fail_next_save(env, "topic")
    with pytest.raises(StorageError, match="injected"):
        await ml.update_properties({"a": "1", "gone": None})
    await ml.update_properties({"a": "1", "gone": None})      # the same again: saved now
    await ml.close()
    again = await ManagedLedger.open(reopen(env), TOPIC)
    assert again.properties == {"a": "1"}
