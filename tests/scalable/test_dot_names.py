"""Subscriptions and consumers named "." or ".." (found by an audit): their names became the
metadata path's relative segments, which the store refuses, so registering failed with an
internal path error after part of the state was written. A name is one path segment, escaped."""

from __future__ import annotations

import pytest

from pyengine.scalable.resources import ScalableTopicResources
from pyengine.scalable.service import scalable_topic_name
from tests.scalable.conftest import TOPIC


@pytest.mark.parametrize(("subscription", "consumer"), [("..", "c1"), ("ok", ".."), (".", "."), ("a.b", "..x")])
async def test_dot_names_are_names(services, subscription, consumer) -> None:
    service = await services("a")
    await service.create_topic(TOPIC, 2)
    controller = await service.controller(TOPIC)
    assignment = await controller.register_consumer(subscription, consumer)
    assert sorted(assignment.segment_ids) == [0, 1]
    assert await service.resources.subscriptions(controller.topic) == [subscription]
    stored = await service.resources.consumers(controller.topic, subscription)
    assert [record.consumer_name for record in stored] == [consumer]
    await controller.delete_subscription(subscription)
    assert await service.resources.subscriptions(controller.topic) == []


def test_only_whole_dot_segments_are_escaped() -> None:
    path = ScalableTopicResources.consumer_path
    topic = scalable_topic_name(TOPIC)
    assert path(topic, "..", ".").endswith("/subscriptions/%2E%2E/consumers/%2E")
    assert path(topic, "a.b", "...").endswith("/subscriptions/a.b/consumers/...")
