"""A reader is a consumer of its topic on a non-durable subscription, as in Pulsar (found by an
audit): a DELETE without force is refused while one is connected, the topic's stats list its
subscription (`isDurable` false) and the metrics count it. Before, a lone reader was invisible:
the topic was deleted under it (and its reconnect created it again), stats showed no
subscription and pulsar_consumers_count 0."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from pyengine.client.message import MessageId

P = "/admin/v2/persistent/public/default"


async def test_a_connected_reader_keeps_its_topic_from_a_plain_delete(api, client):
    producer = await client.create_producer("persistent://public/default/read-only")
    await producer.send(b"x")
    await producer.close()
    reader = await client.create_reader("persistent://public/default/read-only", MessageId.earliest)
    reply = await api.delete(f"{P}/read-only")
    assert reply.status == 412 and reply.body == {"reason": "Topic has active producers/subscriptions"}
    await api.put(f"{P}/read-parts/partitions", 2)
    part_reader = await client.create_reader("persistent://public/default/read-parts-partition-1",
                                             MessageId.earliest)
    assert (await api.delete(f"{P}/read-parts/partitions")).status == 412
    await reader.close()
    await part_reader.close()
    assert (await api.delete(f"{P}/read-only")).status == 204
    assert (await api.delete(f"{P}/read-parts/partitions")).status == 204


async def test_a_readers_subscription_is_in_the_stats_and_metrics(api, client):
    producer = await client.create_producer("persistent://public/default/read-stats")
    await producer.send(b"x")
    reader = await client.create_reader("persistent://public/default/read-stats", MessageId.earliest)
    stats = (await api.get(f"{P}/read-stats/stats")).body
    [(name, sub)] = stats["subscriptions"].items()
    assert sub["isDurable"] is False and len(sub["consumers"]) == 1
    # The topic's backlog sums every subscription's, readers' too, as Pulsar's pulsar_msg_backlog
    # (found by an audit: the metrics counted the reader's subscription but not its backlog).
    assert stats["msgBacklog"] == sub["msgBacklog"] == 1
    text = (await api.get("/metrics")).body
    samples = {(s.name, s.labels.get("topic")): s.value for family in text_string_to_metric_families(text)
               for s in family.samples}
    topic = "persistent://public/default/read-stats"
    assert samples[("pulsar_consumers_count", topic)] == 1
    assert samples[("pulsar_subscriptions_count", topic)] == 1
    assert samples[("pulsar_msg_backlog", topic)] == 1
    by_subscription = {(s.name, s.labels.get("subscription")): s.value
                       for family in text_string_to_metric_families(text) for s in family.samples
                       if s.labels.get("topic") == topic}
    assert by_subscription[("pulsar_subscription_back_log", name)] == 1
    assert by_subscription[("pulsar_subscription_unacked_messages", name)] == 0
    await reader.close()
    await producer.close()
