"""Topic compaction: `/admin/v2/persistent/{tenant}/{namespace}/{topic}/compaction` (Pulsar's
PersistentTopics triggerCompaction / compactionStatus).

PUT starts a compaction and answers at once (204), 409 "Compaction already in progress" when
one is running (Pulsar's AlreadyRunningException -> ConflictException). On a partitioned topic
it starts one on each partition, as Pulsar's internalTriggerCompaction does (here: on each
partition that exists). GET answers the LongRunningProcessStatus of the topic's last
compaction: `{"status": NOT_RUN | RUNNING | SUCCESS | ERROR, "lastError": ...}`; as in Pulsar it
is asked of a non-partitioned topic or of one partition (the partitioned topic's own name is
404).
"""

from __future__ import annotations

from pyengine.admin.errors import CONFLICT, AdminError
from pyengine.admin.routes_topics import TOPIC_URL, existing_topic, partition_names, requested_topic
from pyengine.admin.routing import Call, Reply, RouteTable
from pyengine.admin.schemas import DONE, TOPIC_PATH, errors
from pyengine.broker.compaction import ERROR, NOT_RUN, RUNNING, SUCCESS, CompactionAlreadyRunningError

routes = RouteTable("persistent topics")
COMPACTION_URL = TOPIC_URL + "/compaction"
LONG_RUNNING_PROCESS_STATUS = {
    "type": "object", "description": "LongRunningProcessStatus",
    "properties": {"status": {"type": "string", "enum": [NOT_RUN, RUNNING, SUCCESS, ERROR]},
                   "lastError": {"type": "string"}},
}


@routes.add("PUT", COMPACTION_URL, summary="Trigger a compaction of the topic (of each partition).",
            params=TOPIC_PATH, replies={204: DONE, **errors(404, 409, 412)})
async def trigger_compaction(call: Call) -> None:
    service = call.service
    name = requested_topic(call)
    partitions = service.policies.partitions(str(name))
    if partitions:
        # (a partition being unloaded: on the one loaded again, not the closing one it drops)
        topics = [await service.get_open_topic(p) for p in partition_names(name, partitions)
                  if service.topic_exists(p)]
    else:
        topics = [await existing_topic(service, name)]
    running = [topic for topic in topics if topic.compaction.running]
    if running:
        raise AdminError(CONFLICT, "Compaction already in progress")
    for topic in topics:
        try:
            topic.compaction.trigger()
        except CompactionAlreadyRunningError as exc:
            raise AdminError(CONFLICT, str(exc)) from None


@routes.add("GET", COMPACTION_URL, summary="Status of the topic's last compaction (LongRunningProcessStatus).",
            params=TOPIC_PATH, replies={200: Reply("The status", LONG_RUNNING_PROCESS_STATUS),
                                        **errors(404, 412)})
async def compaction_status(call: Call) -> dict[str, str]:
    topic = await existing_topic(call.service, requested_topic(call))
    return topic.compaction.status_json()
