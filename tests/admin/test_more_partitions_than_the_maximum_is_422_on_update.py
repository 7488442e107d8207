"""More partitions than the maximum: 406 when a partitioned topic is created, 422 with Pulsar's
reason (internalUpdatePartitionedTopicAsync) when its partitions are increased; 0 or fewer is
406 on both."""

from __future__ import annotations

from pyengine.admin.schemas import MAX_PARTITIONS

P = "/admin/v2/persistent/public/default"


async def test_update_above_the_maximum_is_422(api, service):
    assert (await api.put(f"{P}/p/partitions", 1)).status == 204
    reply = await api.post(f"{P}/p/partitions", MAX_PARTITIONS + 1)
    assert (reply.status, reply.body) == (422, {"reason": f"Expect partitions {MAX_PARTITIONS + 1} grater than "
                                                          f"maximum partitions per topic {MAX_PARTITIONS}"})
    assert (await api.post(f"{P}/p/partitions", 2**70)).status == 422
    assert (await api.post(f"{P}/p/partitions", 0)).status == 406
    assert (await api.post(f"{P}/p/partitions", -1)).status == 406
    assert service.policies.partitions("persistent://public/default/p") == 1
    assert not service.topic_exists("persistent://public/default/p-partition-1")


async def test_create_above_the_maximum_stays_406(api):
    assert (await api.put(f"{P}/q/partitions", MAX_PARTITIONS + 1)).status == 406
    # Also where the body is the metadata (a topic created with properties).
    assert (await api.put(f"{P}/q/partitions", {"partitions": MAX_PARTITIONS + 1, "properties": {}})).status == 406
    assert (await api.get(f"{P}/q/partitions")).status == 404


async def test_the_documented_replies(api):
    partitions = (await api.get("/openapi.json")).body["paths"][f"/admin/v2/persistent/{{tenant}}/{{namespace}}"
                                                               "/{topic}/partitions"]
    assert "maximum" not in partitions["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert "422" in partitions["post"]["responses"]
    count, metadata = partitions["put"]["requestBody"]["content"]["application/json"]["schema"]["anyOf"]
    assert count["maximum"] == metadata["properties"]["partitions"]["maximum"] == MAX_PARTITIONS
