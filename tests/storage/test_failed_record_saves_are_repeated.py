"""A topic-record save that fails (a full map, a failing disk) is repeated by the next call of
what asked for it: the change is in force in memory at once, so without that the call would
answer "done" while a restart finds the topic as it was."""

import pytest

from pyengine.storage import ManagedLedger, StorageEnvironment, StorageError
from pyengine.storage.errors import TopicTerminatedError
from tests.storage.helpers import fail_next_save

TOPIC = "persistent://public/default/t"


def fail_next_topic_record_save(env) -> list:
    """The next group commit that writes a topic record fails as a whole."""
    return fail_next_save(env, "topic")


async def reopened(tmp_path, env, ml):
    await ml.close()
    env.close()
    env = StorageEnvironment(tmp_path / "data")
    return env, await ManagedLedger.open(env, TOPIC)


async def test_a_terminate_whose_save_failed_is_saved_by_the_next_call(tmp_path):
    env = StorageEnvironment(tmp_path / "data")
    try:
        ml = await ManagedLedger.open(env, TOPIC)
        last = await ml.append(b"m")
        failed = fail_next_topic_record_save(env)
        with pytest.raises(StorageError, match="injected"):
            await ml.terminate()
        assert failed
        with pytest.raises(TopicTerminatedError):      # sealed in memory all the same
            await ml.append(b"after")
        assert await ml.terminate() == last            # saved now
        env, ml = await reopened(tmp_path, env, ml)
        assert ml.terminated_at == last
        with pytest.raises(TopicTerminatedError):
            await ml.append(b"after a restart")
    finally:
        env.close()


async def test_a_property_whose_save_failed_is_saved_by_the_next_call(tmp_path):
    env = StorageEnvironment(tmp_path / "data")
    try:
        ml = await ManagedLedger.open(env, TOPIC)
        fail_next_topic_record_save(env)
        with pytest.raises(StorageError, match="injected"):
            await ml.set_property("txn", "1")
        await ml.set_property("txn", "1")
        env, ml = await reopened(tmp_path, env, ml)
        assert ml.properties.get("txn") == "1"
    finally:
        env.close()
