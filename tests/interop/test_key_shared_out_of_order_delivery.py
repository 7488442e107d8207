"""The official client (pulsar-client 3.13) on Key_Shared with
`key_shared_policy=pulsar.ConsumerKeySharedPolicy(allow_out_of_order_delivery=...)`, against
`pyengine serve`, as on Apache Pulsar 4.0: allowed, a key moved to a joining consumer reaches it
while the previous consumer still holds an unacknowledged message of it; not allowed (the
default), the key's hash drains at the previous consumer and the joiner gets nothing of it until
that message is acknowledged. A consumer asking for the other setting than the subscription's
consumers is refused (ConsumerBusy), and Sticky consumers must not overlap (ConsumerAssignError)."""

from __future__ import annotations

import time

import pulsar
import pytest

from pyengine.testing import ServeProcess
from tests.broker.test_key_shared_draining_hashes import a_key
from tests.interop.conftest import QUIET
from tests.interop.test_official_client import NS, assert_nothing_more

MOVED = a_key("c0", "c1", ["c0"], ["c0", "c1"])     # the broker's ring gives it to c1 once c1 joins


def subscribe(official: pulsar.Client, topic: str, name: str, allowed: bool) -> pulsar.Consumer:
    return official.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.KeyShared, consumer_name=name,
                              key_shared_policy=pulsar.ConsumerKeySharedPolicy(
                                  allow_out_of_order_delivery=allowed))


def subscription_stats(broker: ServeProcess, topic: str) -> dict:
    local_name = topic.rsplit("/", 1)[1]
    return broker.admin("GET", f"/admin/v2/persistent/public/default/{local_name}/stats")["subscriptions"]["s"]


def wait_for_refused_delivery(broker: ServeProcess, topic: str) -> None:
    """Until the broker has kept a message of a draining hash from another consumer."""
    deadline = time.monotonic() + 5
    while not any(entry["blockedAttempts"] for consumer in subscription_stats(broker, topic)["consumers"]
                  for entry in consumer["drainingHashes"]):
        assert time.monotonic() < deadline, subscription_stats(broker, topic)
        time.sleep(0.02)


@pytest.mark.parametrize("allowed", [True, False])
def test_a_moved_key_reaches_a_joining_consumer_only_when_out_of_order_delivery_is_allowed(
        broker: ServeProcess, official: pulsar.Client, allowed: bool) -> None:
    topic = f"{NS}/key-shared-out-of-order-{str(allowed).lower()}"
    producer = official.create_producer(topic, batching_enabled=False)
    c0 = subscribe(official, topic, "c0", allowed)
    producer.send(b"m0", partition_key=MOVED)
    held = c0.receive(timeout_millis=5000)              # not acknowledged yet
    c1 = subscribe(official, topic, "c1", allowed)
    producer.send(b"m1", partition_key=MOVED)
    if allowed:
        assert c1.receive(timeout_millis=5000).data() == b"m1"
        stats = subscription_stats(broker, topic)
        assert stats["allowOutOfOrderDelivery"] is True and stats["drainingHashesCount"] == 0
    else:
        wait_for_refused_delivery(broker, topic)
        assert_nothing_more(c1)
        assert subscription_stats(broker, topic)["allowOutOfOrderDelivery"] is False
        c0.acknowledge(held)
        assert c1.receive(timeout_millis=5000).data() == b"m1"
    assert_nothing_more(c0)


@pytest.mark.parametrize("allowed", [True, False])
def test_a_consumer_asking_for_the_other_setting_is_refused(official: pulsar.Client, allowed: bool) -> None:
    topic = f"{NS}/key-shared-out-of-order-mismatch-{str(allowed).lower()}"
    subscribe(official, topic, "c0", allowed)
    with pytest.raises(pulsar.ConsumerBusy):
        subscribe(official, topic, "c1", not allowed)


def sticky(official: pulsar.Client, topic: str, name: str, ranges: list[tuple[int, int]]) -> pulsar.Consumer:
    return official.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.KeyShared, consumer_name=name,
                              key_shared_policy=pulsar.ConsumerKeySharedPolicy(
                                  pulsar.KeySharedMode.Sticky, sticky_ranges=ranges))


def test_sticky_ranges_taken_by_another_consumer_are_refused(broker, official: pulsar.Client) -> None:
    """The official client gets ConsumerAssignError (not retried) for overlapping ranges, and
    ConsumerBusy for an AutoSplit consumer beside Sticky ones, as from Apache Pulsar."""
    topic = f"{NS}/key-shared-sticky-conflict"
    sticky(official, topic, "c0", [(0, 100)])
    # Not retried until the operation timeout: one of 60 s, far from a loaded machine's stalls.
    patient = pulsar.Client(broker.url, logger=QUIET, operation_timeout_seconds=60)
    try:
        started = time.monotonic()
        with pytest.raises(pulsar.ConsumerAssignError):
            sticky(patient, topic, "c1", [(100, 200)])
        assert time.monotonic() - started < 30
    finally:
        patient.close()
    sticky(official, topic, "c2", [(101, 200)])
    with pytest.raises(pulsar.ConsumerBusy):
        subscribe(official, topic, "c3", False)
