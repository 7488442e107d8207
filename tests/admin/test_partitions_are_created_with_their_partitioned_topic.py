"""As Pulsar's tryCreatePartitionsAsync: creating a partitioned topic creates its partitions at
once, and increasing its partitions creates the new ones, so the topic lists and the
partitioned stats show every partition before any client used it."""

from __future__ import annotations

P = "/admin/v2/persistent/public/default"
NS = "persistent://public/default"


def partitions(name: str, count: int) -> list[str]:
    return [f"{NS}/{name}-partition-{index}" for index in range(count)]


async def test_created_partitions_are_listed_and_in_the_stats(api, service):
    assert (await api.put(f"{P}/p/partitions", 3)).status == 204
    assert all(service.topic_exists(name) for name in partitions("p", 3))
    assert sorted((await api.get(P)).body) == partitions("p", 3)
    assert sorted((await api.get("/admin/v2/namespaces/public/default/topics")).body) == partitions("p", 3)
    stats = (await api.get(f"{P}/p/partitioned-stats")).body
    assert sorted(stats["partitions"]) == partitions("p", 3)
    assert (await api.get(f"{P}/p-partition-1/partitions")).body == {"partitions": 0}
    assert (await api.get(f"{P}/p-partition-2/stats")).status == 200


async def test_added_partitions_are_created(api, service):
    assert (await api.put(f"{P}/grown/partitions", 2)).status == 204
    assert (await api.post(f"{P}/grown/partitions", 4)).status == 204
    assert sorted((await api.get(P)).body) == partitions("grown", 4)
    assert sorted((await api.get(f"{P}/grown/partitioned-stats")).body["partitions"]) == partitions("grown", 4)


async def test_an_update_creates_a_missing_partition_also_at_the_same_count(api, service):
    assert (await api.put(f"{P}/mended/partitions", 2)).status == 204
    assert (await api.delete(f"{P}/mended-partition-1")).status == 204
    assert (await api.post(f"{P}/mended/partitions", 2)).status == 204
    assert service.topic_exists(f"{NS}/mended-partition-1")


async def test_deleting_the_partitioned_topic_deletes_its_partitions(api, service):
    assert (await api.put("/admin/v2/namespaces/public/brief")).status == 204
    assert (await api.put("/admin/v2/persistent/public/brief/gone/partitions", 3)).status == 204
    assert (await api.delete("/admin/v2/namespaces/public/brief")).status == 409          # not empty
    assert (await api.delete("/admin/v2/persistent/public/brief/gone/partitions")).status == 204
    assert not any(service.topic_exists(f"persistent://public/brief/gone-partition-{index}") for index in range(3))
    assert (await api.get("/admin/v2/persistent/public/brief")).body == []
    assert (await api.delete("/admin/v2/namespaces/public/brief")).status == 204          # nothing left in it
