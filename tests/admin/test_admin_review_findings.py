"""Findings of an admin REST API review: each test pins a behaviour where the admin API
departed from Apache Pulsar's (or from itself); each failed on the code as reviewed."""

from __future__ import annotations

from types import SimpleNamespace

from tests.admin.helpers import drain
from tests.broker.test_compaction import send_batch

P = "/admin/v2/persistent/public/default"
T = "persistent://public/default/"


async def received(client, topic: str, subscription: str = "s") -> list[bytes]:
    consumer = await client.subscribe(T + topic, subscription)
    messages = await drain(consumer)
    await consumer.close()
    return [m.data for m in messages]


async def batch_then_one(client, service, topic: str):
    producer = await client.create_producer(T + topic)
    batch = await send_batch(SimpleNamespace(service=service), producer,
                             [(None, b"b0"), (None, b"b1"), (None, b"b2"), (None, b"b3")])
    await producer.send(b"after")
    await producer.close()
    return batch


# --- reset-cursor to a message inside a batch ---------------------------------------------------
# Pulsar's internalResetCursorOnPosition reads the entry's batch size and seeks with an ack set
# (calculatePositionAckSet): isExcluded with batchIndex i keeps messages i+1.. of the batch,
# and without isExcluded batchIndex i acknowledges messages 0..i-1. Here batchIndex is ignored:
# isExcluded jumps past the whole entry, dropping the rest of the batch.

async def test_reset_cursor_excluding_a_batch_index_keeps_the_rest_of_the_batch(api, client, service):
    batch = await batch_then_one(client, service, "rb")
    assert (await api.put(f"{P}/rb/subscription/s", {"ledgerId": -1, "entryId": -1})).status == 204
    at = {"ledgerId": batch.ledger_id, "entryId": batch.entry_id}
    reply = await api.post(f"{P}/rb/subscription/s/resetcursor", {**at, "batchIndex": 1, "isExcluded": True})
    assert reply.status == 204
    assert await received(client, "rb") == [b"b2", b"b3", b"after"]


async def test_reset_cursor_to_a_batch_index_skips_the_messages_before_it(api, client, service):
    batch = await batch_then_one(client, service, "rb2")
    assert (await api.put(f"{P}/rb2/subscription/s", {"ledgerId": -1, "entryId": -1})).status == 204
    at = {"ledgerId": batch.ledger_id, "entryId": batch.entry_id}
    assert (await api.post(f"{P}/rb2/subscription/s/resetcursor", {**at, "batchIndex": 2})).status == 204
    assert await received(client, "rb2") == [b"b2", b"b3", b"after"]


# --- the transaction coordinators' assign topic through the generic topics API -------------------
# persistent://pulsar/system/transaction_coordinator_assign is the durable count of transaction
# coordinators: clients read its partitions to find the coordinators, a restart runs that many.
# POST .../transactionCoordinator/replicas changes it with its checks (only grows, keys must not
# move: 409) and starts the new coordinators. The generic partitioned-topic routes change or
# delete the same record with none of that.

TC_ASSIGN = "/admin/v2/persistent/pulsar/system/transaction_coordinator_assign"
TXN = "/admin/v3/transactions"


async def test_updating_the_tc_assign_topic_keeps_it_equal_to_the_coordinators_running(api):
    assert (await api.get(f"{TC_ASSIGN}/partitions")).body == {"partitions": 2}
    reply = await api.post(f"{TC_ASSIGN}/partitions", 4)
    running = len((await api.get(f"{TXN}/coordinators")).body)
    advertised = (await api.get(f"{TC_ASSIGN}/partitions")).body["partitions"]
    # Either refused, or the 4 coordinators clients now look for are running.
    assert reply.status != 204 or running == advertised, (reply.status, running, advertised)


async def test_the_tc_assign_topic_cannot_be_deleted_through_the_topics_api(api):
    await api.delete(f"{TC_ASSIGN}/partitions")
    # Clients discover the coordinators by this metadata: gone, a new client finds none.
    assert (await api.get(f"{TC_ASSIGN}/partitions")).body == {"partitions": 2}


# --- topics named as the broker's transaction internals --------------------------------------------
# Pulsar's validateCreateTopic (create a topic, create a partitioned topic): a name of a
# transaction internal topic (SystemTopicNames.isTransactionInternalName: the coordinators'
# assign topic and logs, `<topic>-<subscription>__transaction_pending_ack`) is 400 "Cannot
# create topic in system topic format!". Here it is created, and then hidden from the topic
# lists as a system topic.

async def test_a_pending_ack_store_name_cannot_be_created_as_a_topic(api):
    assert (await api.put(f"{P}/t-s__transaction_pending_ack")).status == 400
    assert (await api.put(f"{P}/u-s__transaction_pending_ack/partitions", 2)).status == 400


# --- creating a subscription auto-creates a partition beyond the partitioned topic's count --------
# PUT .../{topic} refuses `<pt>-partition-<n>` with n >= the partition count (412,
# check_non_partitioned_topic_name), and producers/consumers are refused it (lookup's
# resolve_topic: TopicNotFound), as Pulsar's BrokerService.getTopic does not auto-create a
# partition outside the metadata. PUT .../subscription/{sub} creates it all the same: a stray
# topic that outlives its partitioned topic's count and makes update-partitioned-topic 409.

async def test_a_subscription_does_not_create_a_partition_beyond_the_count(api):
    assert (await api.put(f"{P}/pt/partitions", 2)).status == 204
    reply = await api.put(f"{P}/pt-partition-7/subscription/s")
    assert reply.status in (404, 412), reply
    assert f"{T}pt-partition-7" not in (await api.get(P)).body
    assert (await api.post(f"{P}/pt/partitions", 4)).status == 204


# --- /openapi.json: the 400 of a malformed query parameter is not documented everywhere ------------
# Every boolean or integer query parameter is parsed before the handler runs and a value that is
# not one is answered 400 (routing.from_text). Some operations do not list 400 among their
# responses, so the document disagrees with what the server answers.

NAMES = {"tenant": "public", "namespace": "default", "topic": "t", "subName": "s", "domain": "persistent"}


async def test_every_operation_documents_the_400_it_answers_for_a_malformed_query_parameter(api):
    document = (await api.get("/openapi.json")).body
    undocumented = []
    for path, methods in sorted(document["paths"].items()):
        for method, operation in sorted(methods.items()):
            for parameter in operation.get("parameters", []):
                if parameter["in"] != "query" or parameter["schema"].get("type") not in ("boolean", "integer"):
                    continue
                url = path
                for name, value in NAMES.items():
                    url = url.replace("{" + name + "}", value)
                if "{" in url:
                    continue
                reply = await api.call(method.upper(), f"{url}?{parameter['name']}=maybe")
                if str(reply.status) not in operation["responses"]:
                    undocumented.append((method.upper(), path, parameter["name"], reply.status))
    assert undocumented == []


# --- partitioned metadata with checkAllowAutoCreation in a namespace that does not exist ----------
# Pulsar checks the namespace before reading the metadata (validateGlobalNamespaceOwnership:
# 404 "Namespace ... doesn't exist"), as this broker's own binary PARTITIONED_METADATA does
# (lookup.partition_count: TopicNotFound). HTTP-lookup clients ask this route with
# checkAllowAutoCreation=true; here it answers 200 {"partitions": 0} for a topic of a tenant or
# namespace that does not exist.

async def test_partitioned_metadata_of_a_topic_in_a_missing_namespace_is_404(api):
    for path in ("/admin/v2/persistent/public/nope/x/partitions", "/admin/v2/persistent/nope/nope/x/partitions"):
        assert (await api.get(path)).status == 404
        assert (await api.get(path + "?checkAllowAutoCreation=true")).status == 404, path


# --- reset-cursor to a message id on a partitioned topic: 405 before the subscription is looked up --
# Pulsar's internalResetCursorOnPosition answers 405 "Reset-cursor at position is not allowed for
# partitioned-topic" from the partitioned metadata alone (as skip and expire-by-id do here);
# here the subscription is looked up first, so one that no partition has gets 404 instead.

async def test_reset_cursor_by_id_on_a_partitioned_topic_is_405_whatever_the_subscription(api):
    assert (await api.put(f"{P}/rp/partitions", 2)).status == 204
    body = {"ledgerId": 1, "entryId": 0}
    assert (await api.post(f"{P}/rp/subscription/none/resetcursor", body)).status == 405
