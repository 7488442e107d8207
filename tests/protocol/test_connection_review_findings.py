"""Findings of a review of the broker's connection handling (pyengine/protocol), each pinned
by a test that failed on the code as reviewed."""

from __future__ import annotations

from core_ext.frames import encode_payload_frame
from pyengine.protocol.commands import base_command, serialize_command
from pyengine.protocol.server import ProtocolServer
from tests.protocol.wire_driver import WireClient, frame, metadata

TOPIC = "persistent://public/default/review-findings"


def send_frame(producer_id: int, sequence_id: int, producer_name: str = "p") -> bytes:
    command = serialize_command(base_command("SEND", producer_id=producer_id, sequence_id=sequence_id))
    return encode_payload_frame(command, metadata(producer_name, sequence_id), b"m%d" % sequence_id)


async def test_close_producer_read_in_the_turn_its_sends_are_stored_still_answers_them(
        server: ProtocolServer, client: WireClient, monkeypatch) -> None:
    """The CLOSE_PRODUCER is read in the loop turn right after the group commit holding the
    producer's sends completed (the storage's `_flushed` callback ran, the ledger's
    `_appended`, which resolves the sends' outcomes, is queued). The close's task is queued
    behind `_appended`, and the `_settled` callbacks that `_appended` queues come after the
    task: its `NetworkProducer.wait_idle` finds every outcome done and returns at once, the
    producer is closed and SUCCESS written, then `_drain` drops the receipts (the producer is
    closed). The close is answered after the receipts, as when it waits for them."""
    from tests.broker.helpers import GatedWriter

    await client.create_producer(TOPIC, producer_name="p")
    connection = next(iter(server.connections))
    env = server.service.env
    original = env._flushed
    close = [frame("CLOSE_PRODUCER", producer_id=0, request_id=7)]

    def flushed(*args):
        original(*args)
        if close:
            connection.data_received(close.pop())     # the next frame, read in this very turn

    gate = GatedWriter(env)
    try:
        client.send_raw(b"".join(send_frame(0, i) for i in range(3)))
        await gate.next_commit()                 # the sends' group commit is held
        monkeypatch.setattr(env, "_flushed", flushed)
    finally:
        gate.open()
    answers = []
    while True:
        cmd = await client.receive(timeout=3)
        answers.append(cmd)
        if cmd.HasField("success"):
            break
    receipts = [c.send_receipt.sequence_id for c in answers if c.HasField("send_receipt")]
    assert receipts == [0, 1, 2], f"receipts before the close's SUCCESS: {receipts}"
    await client.no_command(0.3)


