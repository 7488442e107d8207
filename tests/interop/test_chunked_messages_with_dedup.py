"""The official client's chunking on a namespace with de-duplication: every chunk of a message
shares its sequence id, and the broker must store them all (Apache #20948), else the send
succeeds and the message never reaches a consumer."""

from __future__ import annotations

import pulsar

from pyengine.testing import ServeProcess


def test_a_chunked_message_is_delivered_whole_with_deduplication_on(broker: ServeProcess,
                                                                   official: pulsar.Client) -> None:
    broker.admin("PUT", "/admin/v2/namespaces/public/chunks-dedup")
    broker.admin("POST", "/admin/v2/namespaces/public/chunks-dedup/deduplication", True)
    topic = "persistent://public/chunks-dedup/big"
    consumer = official.subscribe(topic, "sub")
    producer = official.create_producer(topic, producer_name="chunker", chunking_enabled=True,
                                        batching_enabled=False)
    big = bytes(range(256)) * (6 * 4096)            # 6 MiB: above the 5 MiB limit, two chunks
    producer.send(big)
    producer.send(b"after")
    first = consumer.receive(10_000)
    assert len(first.data()) == len(big) and first.data() == big
    assert consumer.receive(10_000).data() == b"after"
