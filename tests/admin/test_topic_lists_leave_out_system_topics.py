"""The topic lists of a namespace leave out system topics unless includeSystemTopic=true, as
Pulsar's (filterSystemTopic with BrokerService.isSystemTopic): every topic of pulsar/system, and
in any namespace the topic policies and transaction buffer snapshot topics and the pending ack
stores."""

from __future__ import annotations

import pytest

from pyengine.admin.names import is_system_topic

PERSISTENT = "/admin/v2/persistent"
NAMESPACES = "/admin/v2/namespaces"
TC_ASSIGN = "persistent://pulsar/system/transaction_coordinator_assign"


async def test_the_system_namespace_lists_nothing_by_default(api):
    assert (await api.get(f"{PERSISTENT}/pulsar/system/partitioned")).body == []
    assert (await api.get(f"{PERSISTENT}/pulsar/system/partitioned?includeSystemTopic=true")).body == [TC_ASSIGN]
    assert (await api.get(f"{PERSISTENT}/pulsar/system/partitioned?includeSystemTopic=maybe")).status == 400


async def test_system_topics_of_a_user_namespace_are_left_out(api, service):
    user = "persistent://public/default/orders"
    system = ["persistent://public/default/__change_events",
              "persistent://public/default/orders-s__transaction_pending_ack"]
    for name in (user, *system):
        await service.get_topic(name)
    # (__change_events-x is no system topic's name: Pulsar compares whole local names)
    assert (await api.put(f"{PERSISTENT}/public/default/__change_events-x/partitions", 1)).status == 204
    assert (await api.put(f"{PERSISTENT}/public/default/__transaction_buffer_snapshot/partitions", 2)).status == 204
    listed_user = [user, "persistent://public/default/__change_events-x-partition-0"]
    snapshot_partitions = [f"persistent://public/default/__transaction_buffer_snapshot-partition-{i}" for i in range(2)]

    for path in (f"{PERSISTENT}/public/default", f"{NAMESPACES}/public/default/topics"):
        assert sorted((await api.get(path)).body) == sorted(listed_user), path
        assert sorted((await api.get(f"{path}?includeSystemTopic=true")).body) == sorted(
            [*listed_user, *system, *snapshot_partitions]), path
    partitioned = f"{PERSISTENT}/public/default/partitioned"
    assert (await api.get(partitioned)).body == ["persistent://public/default/__change_events-x"]
    assert sorted((await api.get(f"{partitioned}?includeSystemTopic=true")).body) == [
        "persistent://public/default/__change_events-x", "persistent://public/default/__transaction_buffer_snapshot"]


@pytest.mark.parametrize(("topic", "system"), [
    (f"{TC_ASSIGN}-partition-0", True),
    ("persistent://pulsar/system/anything", True),
    ("persistent://pulsar/broker-1:8080/healthcheck", True),             # a heartbeat namespace
    ("persistent://public/default/__transaction_buffer_snapshot_segments", True),
    ("persistent://public/default/__transaction_buffer_snapshot_indexes-partition-3", True),
    ("persistent://pulsar/other/t", False),
    ("persistent://public/default/__change_events_not", False),
    ("persistent://public/default/__transaction_pending_ack-x", False),
])
def test_which_topics_are_system_topics(topic, system):
    assert is_system_topic(topic) is system
