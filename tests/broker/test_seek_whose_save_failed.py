"""A seek whose cursor save fails leaves the dispatcher following the cursor.

The cursor moves in memory at once and is saved with the next group commit. When the save
failed, the subscription's seek raised before resetting its dispatcher: the cursor stood at
the seek's position while the dispatcher went on from its old reads, so a seek back to the
start gave the consumer nothing again (and entries read ahead were still handed out). Now the
dispatcher is reset whatever the save's outcome; the seek's caller gets the error
(PersistenceError, as over the wire), and a retried seek is saved."""

import pytest

from pyengine.broker import Broker
from pyengine.broker.embedded import MessageId
from pyengine.errors import PersistenceError
from tests.broker.helpers import drain
from tests.storage.test_repeated_ack_after_a_failed_save import fail_next_cursor_save

TOPIC = "persistent://public/default/seek-save-fails"


async def test_a_seek_whose_save_failed_delivers_from_its_position(tmp_path):
    async with Broker.embedded(tmp_path) as broker:
        producer = await broker.create_producer(TOPIC)
        for i in range(5):
            await producer.send(b"m%d" % i)
        consumer = await broker.subscribe(TOPIC, "s", initial_position="earliest")
        assert len(await drain(consumer)) == 5
        subscription = broker.service.topics[TOPIC].subscriptions["s"]
        fail_next_cursor_save(subscription.cursor.ledger.env)
        with pytest.raises(PersistenceError, match="injected"):
            await consumer.seek(MessageId.earliest)
        assert [m.data for m in await drain(consumer)] == [b"m%d" % i for i in range(5)]
        await consumer.seek(MessageId.earliest)             # the retry is saved
        assert [m.data for m in await drain(consumer)] == [b"m%d" % i for i in range(5)]
