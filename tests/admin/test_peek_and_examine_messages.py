"""Reading stored messages through the admin API (Pulsar's peekNthMessage, examineMessage and
getMessageById) and `pyengine admin topics peek-messages | examine-message | get-message-by-id`:
the payload as the body, the metadata in X-Pulsar-* headers as Pulsar names and formats them,
transactions' states flagged for the client to filter."""

from __future__ import annotations

import datetime
import zlib

import pytest

from core_ext.batch import build_batch, split_batch
from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.commands import message_metadata
from pyengine.storage.entry import headers_and_payload

TOPIC = "persistent://public/default/peeked"
URL = "/admin/v2/persistent/public/default/peeked"
PUBLISH_MS = 1_700_000_000_123          # 2023-11-14T22:13:20.123Z


async def _setup(api, client, sub: str = "s"):
    await api.put(URL + f"/subscription/{sub}", {"ledgerId": -1, "entryId": -1})
    return await client.create_producer(TOPIC, producer_name="p1")


async def _publish_batch(service, producer, messages: list[tuple[bytes, str, dict[str, str]]], *,
                         compressed: bool = False) -> object:
    """One batch entry of (payload, key, properties), ZLIB-compressed when asked."""
    singles = [(pb.SingleMessageMetadata(payload_size=len(payload), partition_key=key, sequence_id=index,
                                         properties=[pb.KeyValue(key=k, value=v) for k, v in props.items()])
                .SerializeToString(), payload) for index, (payload, key, props) in enumerate(messages)]
    batch = build_batch(singles)
    fields = {"num_messages_in_batch": len(messages)}
    body = batch
    if compressed:
        body = zlib.compress(batch)
        fields.update(compression=pb.ZLIB, uncompressed_size=len(batch))
    metadata = message_metadata(producer.producer_name, 100, PUBLISH_MS, **fields).SerializeToString()
    topic = service.topics[TOPIC]
    position = await topic.publish(producer._producer, headers_and_payload(metadata, body), sequence_id=100,
                                   num_messages=len(messages), publish_time=PUBLISH_MS)
    return position, batch


async def test_a_keyed_message_with_properties_is_answered_with_pulsar_headers(api, client):
    producer = await _setup(api, client)
    sent = await producer.send(b"hello", key="k1", properties={"a": "1", "b": "x y"}, event_time=PUBLISH_MS)
    for path in (URL + "/subscription/s/position/1", URL + "/examinemessage?initialPosition=earliest",
                 URL + "/examinemessage", URL + f"/ledger/{sent.ledger_id}/entry/{sent.entry_id}"):
        reply = await api.get(path)
        assert reply.status == 200, (path, reply.body)
        assert reply.data == b"hello"
        headers = reply.headers
        assert headers["Content-Type"] == "application/octet-stream"
        assert headers["X-Pulsar-Message-ID"] == f"{sent.ledger_id}:{sent.entry_id}"
        assert headers["X-Pulsar-PROPERTY-a"] == "1" and headers["X-Pulsar-PROPERTY-b"] == "x y"
        assert headers["X-Pulsar-event-time"] == "2023-11-14T22:13:20.123Z"
        published = datetime.datetime.fromisoformat(headers["X-Pulsar-publish-time"])
        assert abs(published.timestamp() - datetime.datetime.now().timestamp()) < 60
        assert headers["X-Pulsar-producer-name"] == "p1"
        assert headers["X-Pulsar-sequence-id"] == "0"
        assert headers["X-Pulsar-partition-key"] == "k1"
        assert headers["X-Pulsar-Is-Encrypted"] == "false"
        assert headers["X-Pulsar-txn-uncommitted"] == "false"
        for absent in ("X-Pulsar-num-batch-message", "X-Pulsar-compression", "X-Pulsar-txn-aborted",
                       "X-Pulsar-marker-type"):
            assert absent not in headers


async def test_a_compressed_batch_is_answered_decompressed_and_whole(api, client, service):
    producer = await _setup(api, client)
    messages = [(b"one", "ka", {"p": "1"}), (b"two", "kb", {}), (b"three", "ka", {"q": "3"})]
    position, batch = await _publish_batch(service, producer, messages, compressed=True)
    reply = await api.get(URL + "/subscription/s/position/1")
    assert reply.status == 200
    assert reply.data == batch                      # the client splits it
    assert [payload for _, payload in split_batch(reply.data, 3)] == [b"one", b"two", b"three"]
    headers = reply.headers
    assert headers["X-Pulsar-Message-ID"] == f"{position.ledger_id}:{position.entry_id}"
    assert headers["X-Pulsar-num-batch-message"] == "3"
    assert headers["X-Pulsar-compression"] == "ZLIB"
    assert headers["X-Pulsar-uncompressed-size"] == str(len(batch))
    assert headers["X-Pulsar-publish-time"] == "2023-11-14T22:13:20.123Z"
    # Pulsar's batch size: the stored message less its metadata (magic, checksum, sizes included)
    stored = service.topics[TOPIC].ledger.read_entry(position).data
    metadata_size = int.from_bytes(stored[6:10], "big")
    assert headers["X-Pulsar-batch-size"] == str(len(stored) - metadata_size)


async def test_acknowledged_messages_are_not_counted(api, client):
    producer = await _setup(api, client)
    ids = [await producer.send(f"m{i}".encode()) for i in range(5)]
    consumer = await client.subscribe(TOPIC, "s", consumer_type="shared")
    received = {bytes(m.data): m for m in [await consumer.receive(timeout=2) for _ in range(5)]}
    await consumer.acknowledge(received[b"m0"])        # moves the mark-delete position
    await consumer.acknowledge(received[b"m2"])        # individually
    await consumer.acknowledge(received[b"m3"])
    peeked = [(await api.get(URL + f"/subscription/s/position/{n}")) for n in (1, 2, 3)]
    assert [reply.data for reply in peeked[:2]] == [b"m1", b"m4"]
    assert peeked[1].headers["X-Pulsar-Message-ID"] == f"{ids[4].ledger_id}:{ids[4].entry_id}"
    assert (peeked[2].status, peeked[2].body) == (404, {"reason": "Message not found"})
    # examine and get-by-id read the stored entries, acknowledged or not
    assert (await api.get(URL + "/examinemessage?initialPosition=earliest&messagePosition=3")).data == b"m2"
    assert (await api.get(URL + "/examinemessage?messagePosition=2")).data == b"m3"
    assert (await api.get(URL + "/examinemessage?initialPosition=earliest&messagePosition=99")).data == b"m4"
    assert (await api.get(URL + "/examinemessage?messagePosition=0")).data == b"m4"       # below 1: the 1st
    assert (await api.get(URL + "/examinemessage?messagePosition=6")).status == 404


async def test_transactions_are_flagged_and_markers_answered(api, client, service):
    producer = await _setup(api, client)
    committed = await client.new_transaction()
    await producer.send(b"committed", txn=committed)
    await committed.commit()
    aborted = await client.new_transaction()
    await producer.send(b"aborted", txn=aborted)
    await aborted.abort()
    await producer.send(b"plain")
    still_open = await client.new_transaction()
    await producer.send(b"open", txn=still_open)
    await producer.send(b"after")
    replies = []
    for n in range(1, 8):
        reply = await api.get(URL + f"/subscription/s/position/{n}")
        assert reply.status == 200, (n, reply.body)
        replies.append(reply)
    assert (await api.get(URL + "/subscription/s/position/8")).status == 404
    kinds = [(r.data, r.headers.get("X-Pulsar-marker-type"), r.headers.get("X-Pulsar-txn-aborted"),
              r.headers["X-Pulsar-txn-uncommitted"]) for r in replies]
    # (markers carry their transaction's id, so its state too, as in Pulsar)
    assert kinds == [(b"committed", None, "false", "false"), (b"", "21", "false", "false"),
                     (b"aborted", None, "true", "false"), (b"", "22", "true", "false"),
                     (b"plain", None, None, "false"),
                     (b"open", None, "false", "true"), (b"after", None, None, "true")]
    marker = replies[1].headers
    assert (marker["X-Pulsar-txnid-most-bits"], marker["X-Pulsar-txnid-least-bits"]) == \
        (str(committed.txn_id.most_bits), str(committed.txn_id.least_bits))
    await still_open.commit()
    reply = await api.get(URL + "/subscription/s/position/6")
    assert (reply.data, reply.headers["X-Pulsar-txn-uncommitted"]) == (b"open", "false")


async def test_partitioned_topics_are_read_through_their_partitions(api, client):
    await api.put(URL + "/partitions", 2)
    await api.put(URL + "/subscription/s", {"ledgerId": -1, "entryId": -1})
    producer = await client.create_producer(TOPIC + "-partition-1")
    sent = await producer.send(b"p1")
    reply = await api.get(URL + "/subscription/s/position/1")
    assert (reply.status, reply.body) == (405, {"reason": "Peek messages on a partitioned topic is not allowed"})
    reply = await api.get(URL + "/examinemessage")
    assert reply.status == 405 and "partitioned topic is not allowed" in reply.body["reason"]
    assert (await api.get(URL + f"/ledger/{sent.ledger_id}/entry/{sent.entry_id}")).status == 404
    partition = URL + "-partition-1"
    assert (await api.get(partition + "/subscription/s/position/1")).data == b"p1"
    assert (await api.get(partition + "/examinemessage")).data == b"p1"
    assert (await api.get(partition + f"/ledger/{sent.ledger_id}/entry/{sent.entry_id}")).data == b"p1"
    assert (await api.get(URL + "-partition-0/subscription/s/position/1")).status == 404


@pytest.mark.parametrize("path, status, reason", [
    ("/subscription/s/position/0", 412, None),
    ("/subscription/s/position/-1", 412, None),
    ("/subscription/s/position/2147483648", 412, None),
    ("/subscription/s/position/x", 400, None),
    ("/subscription/s/position/1.5", 400, None),
    ("/subscription/s/position/2", 404, "Message not found"),
    ("/subscription/nope/position/1", 404, "Subscription not found"),
    ("/examinemessage?messagePosition=x", 400, None),
    ("/examinemessage?initialPosition=middle", 400, None),
    ("/ledger/x/entry/0", 400, None),
    ("/ledger/0/entry/99999999999999999999", 400, None),
    ("/ledger/99/entry/0", 404, "Message not found, the ledgerId does not belong to the topic "
                                "persistent://public/default/peeked"),
])
async def test_malformed_or_missing_positions_are_refused_and_change_nothing(api, client, path, status, reason):
    producer = await _setup(api, client)
    sent = await producer.send(b"only")
    before = (await api.get(URL + "/internalStats")).body["cursors"]
    reply = await api.get(URL + path)
    assert reply.status == status, reply.body
    assert "reason" in reply.body and (reason is None or reply.body["reason"] == reason)
    missing = await api.get(URL + f"/ledger/{sent.ledger_id}/entry/{sent.entry_id + 1}")
    assert (missing.status, missing.body) == (404, {"reason": "Message id not found"})
    assert (await api.get(URL + "/internalStats")).body["cursors"] == before


async def test_missing_topics_are_404(api):
    for path in ("/subscription/s/position/1", "/examinemessage", "/ledger/1/entry/0"):
        reply = await api.get("/admin/v2/persistent/public/default/absent" + path)
        assert reply.status == 404, path


async def test_an_empty_topic_has_no_message_to_examine(api):
    await api.put(URL)
    for position in ("earliest", "latest"):
        reply = await api.get(URL + f"/examinemessage?initialPosition={position}")
        assert (reply.status, reply.body) == (404, {"reason": "Message not found"})


async def test_property_values_that_http_cannot_carry_are_escaped(api, client):
    producer = await _setup(api, client)
    await producer.send(b"x", properties={"line": "a\r\nInjected: 1", "k y": "100%"})
    reply = await api.get(URL + "/subscription/s/position/1")
    assert reply.status == 200
    assert reply.headers["X-Pulsar-PROPERTY-line"] == "a%0D%0AInjected: 1"
    assert reply.headers["X-Pulsar-PROPERTY-k%20y"] == "100%25"
    assert "Injected" not in reply.headers


# --- the command line -------------------------------------------------------------------------

async def test_cli_peek_messages_filters_as_pulsar_admin(api, client, service, admin):
    producer = await _setup(api, client)
    await _publish_batch(service, producer, [(b"b0", "k0", {"p": "0"}), (b"b1", "k1", {})], compressed=True)
    aborted = await client.new_transaction()
    await producer.send(b"aborted", txn=aborted)
    await aborted.abort()
    await producer.send(b"plain", properties={"a": "1"})
    still_open = await client.new_transaction()
    await producer.send(b"open", txn=still_open)

    status, out, err = await admin("topics", "peek-messages", TOPIC, "-s", "s", "-n", "10")
    assert status == 0, err
    assert [m["payload"] for m in out] == ["b0", "b1", "plain"]
    first = out[0]
    assert first["messageId"].endswith(":0") and out[1]["messageId"].endswith(":1")
    assert (first["key"], first["properties"]["p"], first["publishTime"]) == ("k0", "0", PUBLISH_MS)
    assert first["properties"]["X-Pulsar-num-batch-message"] == "2"
    assert out[2]["properties"] == {"a": "1"} and out[2]["producerName"] == "p1"

    status, out, _ = await admin("topics", "peek-messages", TOPIC, "-s", "s", "-n", "10", "--show-server-marker",
                                 "--transaction-isolation-level", "READ_UNCOMMITTED")
    assert [m["payload"] for m in out] == ["b0", "b1", "aborted", "", "plain", "open"]
    assert out[2]["properties"]["X-Pulsar-txn-aborted"] == "true" and out[3]["markerType"] == 22
    assert out[5]["properties"]["X-Pulsar-txn-uncommitted"] == "true"

    status, out, _ = await admin("topics", "peek-messages", TOPIC, "-s", "s", "-n", "2")
    assert [m["payload"] for m in out] == ["b0", "b1"]

    status, out, err = await admin("topics", "peek-messages", TOPIC, "-s", "nope")
    assert status == 1 and "Subscription not found" in err


async def test_cli_examine_message_and_get_message_by_id(api, client, admin):
    producer = await _setup(api, client)
    first = await producer.send(b"first", key="k")
    await producer.send(bytes([0xff, 0x00]))
    status, out, err = await admin("topics", "examine-message", TOPIC, "-i", "earliest", "-m", "1")
    assert status == 0, err
    assert (out["payload"], out["key"], out["messageId"]) == ("first", "k", f"{first.ledger_id}:{first.entry_id}")
    status, out, _ = await admin("topics", "examine-message", TOPIC)
    assert out["payloadBase64"] == "/wA="
    status, out, _ = await admin("topics", "get-message-by-id", TOPIC, "-l", str(first.ledger_id),
                                 "-e", str(first.entry_id))
    assert out["payload"] == "first"
    status, out, err = await admin("topics", "get-message-by-id", TOPIC, "-l", str(first.ledger_id), "-e", "99")
    assert status == 1 and "Message id not found" in err
