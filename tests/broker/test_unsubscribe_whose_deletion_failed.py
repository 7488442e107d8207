"""An unsubscribe whose deletion cannot be written (a full map, a failing disk) fails, and the
subscription is still stored: a restart brings it back. It used to be gone from memory all the
same, so the client's retry was answered SubscriptionNotFound (taken for "deleted") while the
subscription outlived it, holding its backlog after the next restart. Now it goes on as stored
and the retry deletes it."""

from pyengine.broker import Broker
from pyengine.storage import StorageError
from tests.storage.helpers import fail_next_save_after_close

TOPIC = "persistent://public/default/unsubscribed"


def fail_the_deletion_of(topic, name: str) -> list:
    """The cursor deletion that follows the subscription's close fails as a whole."""
    return fail_next_save_after_close(topic.subscriptions[name], topic.ledger.env)


async def test_an_unsubscribe_whose_deletion_failed_can_be_retried(tmp_path):
    async with Broker.embedded(tmp_path / "data", num_coordinators=1) as broker:
        producer = await broker.create_producer(TOPIC)
        await producer.send(b"m0")
        consumer = await broker.subscribe(TOPIC, "S", initial_position="earliest")
        await consumer.close()
        topic = await broker.service.get_topic(TOPIC, create=False)
        failed = fail_the_deletion_of(topic, "S")
        try:
            await topic.unsubscribe("S")
        except StorageError as exc:
            assert "injected" in str(exc)
        else:
            raise AssertionError("the unsubscribe succeeded without its deletion")
        assert failed and failed[0][0] == "cursor"
        assert "S" in topic.subscriptions                   # as stored
        assert topic.subscriptions["S"].backlog() == 1
        await topic.unsubscribe("S")                        # the client's retry
        assert "S" not in topic.subscriptions
    async with Broker.embedded(tmp_path / "data", num_coordinators=1) as broker:
        topic = await broker.service.get_topic(TOPIC, create=False)
        assert "S" not in topic.subscriptions
