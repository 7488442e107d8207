"""Helpers shared by the broker tests."""

import asyncio
import threading


class GatedWriter:
    """Holds each group commit of `env` until the test lets it through (or fails it)."""

    def __init__(self, env) -> None:
        self.env = env
        self.original = env._write_batch
        self.arrived = threading.Semaphore(0)
        self.allowed = threading.Semaphore(0)
        self.failures: list[BaseException] = []
        env._write_batch = self._write

    def _write(self, writes):
        self.arrived.release()
        if not self.allowed.acquire(timeout=10):
            raise RuntimeError("the test never let this group commit through")
        if self.failures:
            raise self.failures.pop(0)
        return self.original(writes)

    async def next_commit(self) -> None:
        """Wait until a group commit is being held."""
        assert await asyncio.to_thread(self.arrived.acquire, True, 10), "no group commit came"

    def let_through(self, failure: BaseException | None = None) -> None:
        """Let one group commit go on, or fail with `failure` (as an I/O error would)."""
        if failure is not None:
            self.failures.append(failure)
        self.allowed.release()

    def open(self) -> None:
        self.env._write_batch = self.original
        for _ in range(100):
            self.allowed.release()


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
