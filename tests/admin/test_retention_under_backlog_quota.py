"""A retention policy smaller than the backlog quota in force is refused with 412, as Pulsar's
checkBacklogQuota: its size must be over the destination_storage limit, its time over the limit
time. On a namespace (NamespacesBase.checkQuotas) only once it has backlog quotas, against its
destination_storage quota, else the broker's default; on a topic against the topic's quota, else
its namespace's, else the broker's default. Unlimited (-1) or zero retentions are not checked."""

from __future__ import annotations

import pytest

from pyengine.broker.service import BrokerConfig, BrokerService

NS = "/admin/v2/namespaces/public/default"
TOPIC = "persistent://public/default/retention-quota"
TOPIC_URL = "/admin/v2/persistent/public/default/retention-quota"
MB = 1 << 20
NS_REFUSED = "Retention Quota must exceed configured backlog quota for namespace."
TOPIC_REFUSED = "Retention Quota must exceed configured backlog quota for topic. Please increase retention quota and retry"


async def test_a_namespace_retention_under_its_quota_is_refused(api):
    assert (await api.post(f"{NS}/backlogQuota", {"limitSize": 2 * MB, "limitTime": 600})).status == 204
    for retention in ({"retentionTimeInMinutes": -1, "retentionSizeInMB": 2},       # 2 MB: not over 2 MB
                      {"retentionTimeInMinutes": 10, "retentionSizeInMB": -1}):     # 600 s: not over 600 s
        refused = await api.post(f"{NS}/retention", retention)
        assert (refused.status, refused.body["reason"]) == (412, NS_REFUSED)
    assert (await api.get(f"{NS}/retention")).status == 204                          # nothing stored
    kept = {"retentionTimeInMinutes": 11, "retentionSizeInMB": 3}
    assert (await api.post(f"{NS}/retention", kept)).status == 204
    assert (await api.get(f"{NS}/retention")).body == kept
    for unlimited in ({"retentionTimeInMinutes": -1, "retentionSizeInMB": -1},
                      {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0}):
        assert (await api.post(f"{NS}/retention", unlimited)).status == 204
    assert (await api.delete(f"{NS}/retention")).status == 204


async def test_a_topic_retention_under_the_quota_in_force_is_refused(api, client):
    await client.create_producer(TOPIC)
    small = {"retentionTimeInMinutes": -1, "retentionSizeInMB": 1}
    assert (await api.post(f"{TOPIC_URL}/retention", small)).status == 204         # no quota anywhere
    assert (await api.post(f"{NS}/backlogQuota", {"limitSize": MB})).status == 204
    refused = await api.post(f"{TOPIC_URL}/retention", small)                       # the namespace's quota
    assert (refused.status, refused.body["reason"]) == (412, TOPIC_REFUSED)
    assert (await api.get(f"{TOPIC_URL}/retention")).body == small                  # the stored one stays
    assert (await api.post(f"{TOPIC_URL}/backlogQuota", {"limitSize": 100})).status == 204
    assert (await api.post(f"{TOPIC_URL}/retention", small)).status == 204          # the topic's quota wins
    assert (await api.post(f"{TOPIC_URL}/backlogQuota?backlogQuotaType=message_age",
                           {"limitTime": 60})).status == 204
    # Only the destination_storage quota counts (its limit time is -1), as in Pulsar.
    assert (await api.post(f"{TOPIC_URL}/retention", {"retentionTimeInMinutes": 1, "retentionSizeInMB": 1})).status \
        == 204


class TestWithABrokerDefaultQuota:
    @pytest.fixture
    async def service(self, tmp_path):
        """The admin fixtures' broker, with a default quota of 1 MB and 60 s."""
        broker = BrokerService(BrokerConfig(data_dir=tmp_path / "data", sync=False, num_coordinators=1,
                                            backlog_quota_default_limit_bytes=MB,
                                            backlog_quota_default_limit_seconds=60))
        await broker.start()
        yield broker
        await broker.close()

    async def test_it_counts_for_a_topic_and_for_a_namespace_with_quotas(self, api, client):
        await client.create_producer(TOPIC)
        one_minute = {"retentionTimeInMinutes": 1, "retentionSizeInMB": -1}
        refused = await api.post(f"{TOPIC_URL}/retention", one_minute)                  # 60 s: not over 60 s
        assert (refused.status, refused.body["reason"]) == (412, TOPIC_REFUSED)
        # A namespace without quotas of its own is not checked; with one (even not a
        # destination_storage one), the broker's default destination_storage quota is.
        assert (await api.post(f"{NS}/retention", one_minute)).status == 204
        assert (await api.delete(f"{NS}/retention")).status == 204
        assert (await api.post(f"{NS}/backlogQuota?backlogQuotaType=message_age", {"limitTime": 30})).status == 204
        refused = await api.post(f"{NS}/retention", one_minute)
        assert (refused.status, refused.body["reason"]) == (412, NS_REFUSED)
