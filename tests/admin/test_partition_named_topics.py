"""Topics named as partitions (`<base>-partition-<n>`), as Pulsar's admin API allows them: a
non-partitioned topic created by name must be an existing partition slot of the partitioned
topic `<base>` (validateNonPartitionTopicName, 412 otherwise); a partitioned topic's name never
contains "-partition-" (validatePartitionedTopicName, 412); and a partitioned topic cannot be
created with fewer partitions than the stored partitions of its name ask for
(getMaxPartitionIndex, 409)."""

from __future__ import annotations

import pytest

from pyengine.broker.policies import ConflictError
from pyengine.errors import InvalidTopicNameError

P = "/admin/v2/persistent/public/default"
NS = "persistent://public/default"


async def test_a_topic_named_as_a_partition_must_be_a_slot_of_a_partitioned_topic(api, service):
    assert (await api.put(f"{P}/p/partitions", 5)).status == 204
    for local in ("p-partition-7", "p-partition-5", "q-partition-0", "-partition-0"):
        reply = await api.put(f"{P}/{local}")
        assert reply.status == 412, (local, reply.body)
        assert not service.topic_exists(f"{NS}/{local}")
    assert "5 partitions" in (await api.put(f"{P}/p-partition-7")).body["reason"]
    assert "not a partitioned topic" in (await api.put(f"{P}/q-partition-0")).body["reason"]
    assert (await api.get(f"{P}/p/partitioned-stats")).body["metadata"] == {"partitions": 5}

    # p's partitions exist from its creation on (Pulsar's tryCreatePartitionsAsync): one deleted
    # by itself leaves its slot, which a PUT of its name fills again.
    assert (await api.put(f"{P}/p-partition-4")).status == 409
    assert (await api.delete(f"{P}/p-partition-4")).status == 204
    assert (await api.put(f"{P}/p-partition-4")).status == 204          # a slot of p: Pulsar creates it
    assert (await api.put(f"{P}/p-partition-4")).status == 409
    assert (await api.put(f"{P}/a-partition-x")).status == 204          # no number after it: no partition's name
    assert (await api.put(f"{P}/a-partition-1-partition-2")).status == 204   # (Pulsar reads from the first one)
    assert (await api.put(f"{P}/a-partition-{'9' * 150}")).status == 204     # past a Java long: not a number
    assert sorted((await api.get(P)).body) == [f"{NS}/a-partition-1-partition-2", f"{NS}/a-partition-{'9' * 150}",
                                              f"{NS}/a-partition-x", *(f"{NS}/p-partition-{i}" for i in range(5))]

    assert (await api.delete(f"{P}/p/partitions")).status == 204
    assert f"{NS}/p-partition-4" not in (await api.get(P)).body
    assert (await api.put(f"{P}/p/partitions", 2)).status == 204        # nothing left over to bound it


async def test_a_missing_namespace_is_404_before_the_name_is_judged(api):
    assert (await api.put("/admin/v2/persistent/public/nowhere/q-partition-0")).status == 404


async def test_a_partitioned_topic_name_cannot_contain_the_partition_suffix(api, service):
    await api.put(f"{P}/a-partition-x")
    for local in ("a-partition-x", "b-partition-0", "c-partition-", "d-partition-e-partition-1"):
        reply = await api.put(f"{P}/{local}/partitions", 2)
        assert reply.status == 412, (local, reply.body)
        with pytest.raises(InvalidTopicNameError):
            await service.policies.create_partitioned_topic(f"{NS}/{local}", 2)
    assert (await api.get(f"{P}/partitioned")).body == []


async def test_stored_partitions_bound_the_partitions_of_a_new_partitioned_topic(api, service, client):
    producer = await client.create_producer(f"{NS}/m-partition-7")      # a producer may still make one
    await producer.close()
    reply = await api.put(f"{P}/m/partitions", 2)
    assert reply.status == 409
    assert reply.body["reason"] == ("The topic has a max partition index of 7, "
                                    "the number of partitions must be at least 8")
    with pytest.raises(ConflictError):                                  # the broker API refuses it too
        await service.policies.create_partitioned_topic(f"{NS}/m", 7)
    assert (await api.get(f"{P}/m/partitions")).status == 404
    assert (await api.put(f"{P}/m/partitions", 8)).status == 204       # then it is one of its partitions

    # Its metadata lost (the broker API forgets only that), its partitions bound it again.
    await service.policies.delete_partitioned_topic(f"{NS}/m")
    assert (await api.put(f"{P}/m/partitions", 3)).status == 409
    assert (await api.put(f"{P}/m/partitions", 8)).status == 204
    assert (await api.delete(f"{P}/m/partitions")).status == 204
    assert (await api.put(f"{P}/m/partitions", 1)).status == 204


async def test_other_topics_do_not_bound_a_new_partitioned_topic(api, client):
    for name in ("n-partition-9-partition-0", "n2-partition-9", "nn-partition-9", "n-partition-x"):
        producer = await client.create_producer(f"{NS}/{name}")
        await producer.close()
    assert (await api.put(f"{P}/n/partitions", 1)).status == 204
