"""Helpers shared by the broker tests."""


async def drain(consumer, timeout=0.2):
    """Everything the consumer can receive now (stops after `timeout` s of silence)."""
    out = []
    while True:
        try:
            out.append(await consumer.receive(timeout=timeout))
        except TimeoutError:
            return out


async def publish_batch(broker, producer, payloads: list[bytes], txn=None):
    """One batch entry of `payloads` (the embedded producer sends single messages only)."""
    from core_ext.batch import build_batch
    from pyengine.protocol.commands import message_metadata
    from pyengine.protocol.pulsar_api_pb2 import SingleMessageMetadata
    from pyengine.storage.entry import headers_and_payload

    topic = broker.service.topics[producer.topic]
    sequence = producer._next_sequence
    producer._next_sequence += len(payloads)
    singles = [(SingleMessageMetadata(payload_size=len(p), sequence_id=sequence + i).SerializeToString(), p)
               for i, p in enumerate(payloads)]
    fields = {"num_messages_in_batch": len(payloads)}
    if txn is not None:
        fields.update(txnid_most_bits=txn.txn_id.most_bits, txnid_least_bits=txn.txn_id.least_bits)
        await txn._register_partition(producer.topic)
    metadata = message_metadata(producer.producer_name, sequence, 1, **fields).SerializeToString()
    return await topic.publish(producer._producer, headers_and_payload(metadata, build_batch(singles)),
                               sequence_id=sequence, num_messages=len(payloads),
                               txn=txn.txn_id if txn is not None else None)
