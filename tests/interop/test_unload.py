"""The official client across topic unloads (`PUT .../unload`): its producer and consumer are
closed by the broker (CLOSE_PRODUCER / CLOSE_CONSUMER), reconnect alone, and nothing is lost; with
de-duplication on, nothing is stored twice either, though sends were in flight at each unload."""

from __future__ import annotations

import threading

import pulsar

from tests.interop.conftest import QUIET

TOPIC = "persistent://public/default/interop-unload"
PATH = "/admin/v2/persistent/public/default/interop-unload"


def test_sends_in_flight_across_unloads_are_stored_once_and_in_order(broker):
    broker.admin("PUT", PATH)
    broker.admin("POST", PATH + "/deduplicationEnabled", True)
    client = pulsar.Client(broker.url, logger=QUIET, operation_timeout_seconds=30)
    try:
        consumer = client.subscribe(TOPIC, "s", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(TOPIC, producer_name="unloaded", batching_enabled=True,
                                          batching_max_publish_delay_ms=1, block_if_queue_full=True)
        failures, acknowledged, progress = [], [0], threading.Condition()

        def sent(result, _message_id):
            with progress:
                if result != pulsar.Result.Ok:
                    failures.append(result)
                acknowledged[0] += 1
                progress.notify_all()

        def until_acknowledged(count: int) -> None:
            with progress:
                assert progress.wait_for(lambda: acknowledged[0] >= count, timeout=30), acknowledged

        total = 600
        for i in range(total):
            producer.send_async(b"%d" % i, sent)
            if i % 150 == 75:
                until_acknowledged(i - 60)          # reconnected since the last unload; up to 60 in flight
                broker.admin("PUT", PATH + "/unload")
        until_acknowledged(total)
        assert failures == []
        received = []
        while len(received) < total:
            message = consumer.receive(timeout_millis=10_000)
            received.append(int(message.data()))
            consumer.acknowledge(message)
        assert received == list(range(total))
        try:
            extra = consumer.receive(timeout_millis=500)
        except pulsar.Timeout:
            extra = None
        assert extra is None, f"stored twice: {extra.data()}"
        assert sum("unloaded topic " + TOPIC in line for line in broker.log_lines(1000)) == 4
        stats = broker.admin("GET", PATH + "/stats")
        assert stats["subscriptions"]["s"]["msgBacklog"] == 0
    finally:
        client.close()
