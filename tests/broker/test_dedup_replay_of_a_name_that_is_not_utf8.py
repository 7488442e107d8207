"""De-duplication's replay of stored entries (after a crash between an entry's commit and its
de-duplication record) reads each entry's producer name from its metadata. A name whose bytes
are not UTF-8 comes as `bytes` (pyengine.protocol.text): the replay kept it as a producer and
writing what it found failed (`bytes` has no `.encode()`), so the topic could not load. No
producer has such a name (PRODUCER refuses it): the entry is skipped, as one with no name."""

import time

from pyengine.broker import Broker
from pyengine.protocol.commands import message_metadata
from pyengine.storage.entry import headers_and_payload
from pyengine_kernels import Position

T = "persistent://public/default/dedup-replay-not-utf8"


async def test_a_stored_producer_name_that_is_not_utf8_is_skipped_by_the_replay(tmp_path):
    async with Broker.embedded(tmp_path, deduplication_enabled=True) as broker:
        producer = await broker.create_producer(T, producer_name="p")
        first = await producer.send(b"named", sequence_id=7)
        topic = await broker.service.get_topic(T)
        meta = message_metadata("\u00e9\u00e9", 3, int(time.time() * 1000)).SerializeToString()
        await topic.ledger.append(headers_and_payload(meta.replace("\u00e9\u00e9".encode(), b"\xff\xfe\xff\xfe"),
                                                      b"unnamed"))
        replayed = topic.dedup._replay(Position(first.ledger_id, first.entry_id - 1))
        assert replayed == {"p": 7}
        topic.dedup._write_replayed(replayed)
