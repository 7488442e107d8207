"""A topic deleted through the admin REST API (force) under the official client (pulsar-client
3.13, C++ 4.2.0), against a `pyengine serve` child: the broker closes the topic's producer and
consumer (CLOSE_PRODUCER, CLOSE_CONSUMER), which the client reconnects alone (its
ClientConnection::handleCloseProducer / handleCloseConsumer), to the topic created again; the
other topic's producer and consumer on the same connection are not disturbed. Found by an
audit: the deleted topic's producer was not told, its next send was answered SEND_ERROR
ServiceNotReady, and the C++ client closes its whole connection on any SEND_ERROR but
ChecksumError: the other topic's consumer was disconnected and sent its unacknowledged message
again."""

from __future__ import annotations

import pulsar

from pyengine.testing import ServeProcess
from tests.interop.test_official_client import ConnectionWatch

NS = "public/default"


def _receive_for(consumer: pulsar.Consumer, wait_ms: int = 1000) -> list[bytes]:
    got = []
    while True:
        try:
            message = consumer.receive(timeout_millis=wait_ms)
        except pulsar.Timeout:
            return got
        consumer.acknowledge(message)
        got.append(message.data())


def test_deleting_a_topic_reconnects_its_producer_and_consumer_only(broker: ServeProcess,
                                                                    official: pulsar.Client) -> None:
    deleted, other = f"persistent://{NS}/deleted-under-the-official-client", f"persistent://{NS}/beside-it"
    producer = official.create_producer(deleted, batching_enabled=False)
    consumer = official.subscribe(deleted, "s", consumer_type=pulsar.ConsumerType.Shared,
                                  initial_position=pulsar.InitialPosition.Earliest)
    other_producer = official.create_producer(other, batching_enabled=False)
    other_consumer = official.subscribe(other, "s", consumer_type=pulsar.ConsumerType.Shared)
    producer.send(b"gone")
    consumer.acknowledge(consumer.receive(timeout_millis=5000))
    other_producer.send(b"kept")
    assert other_consumer.receive(timeout_millis=5000).data() == b"kept"    # not acknowledged

    with ConnectionWatch(other_consumer) as watch:
        broker.admin("DELETE", f"/admin/v2/persistent/{NS}/deleted-under-the-official-client?force=true")
        # The producer reconnects (retried while the deletion goes on) to the topic created again.
        producer.send(b"after")
        assert _receive_for(consumer) == [b"after"]     # its consumer too, on the new topic
        other_producer.send(b"other")
        # Once, and not the unacknowledged message again: its connection stayed.
        assert _receive_for(other_consumer) == [b"other"]
    assert watch.samples > 0 and watch.disconnected == []
    stats = broker.admin("GET", f"/admin/v2/persistent/{NS}/deleted-under-the-official-client/stats")
    assert len(stats["publishers"]) == 1
    assert [len(s["consumers"]) for s in stats["subscriptions"].values()] == [1]

