"""A message id is two uint64 on the wire; the broker reads them as Java's signed longs, so
2^64-2 is -2, which names no entry (-1 is "before the first"). An ACK of such an id was answered
UnknownError (the position type's ValueError leaking out) where any other ack of a position
that holds no entry is NotAllowed; a REDELIVER naming one failed in the frame handler."""

from __future__ import annotations

import pytest

from pyengine.protocol import pulsar_api_pb2 as pb
from tests.protocol.test_ack_batch_size_must_match_the_entry import (  # noqa: F401
    ack,
    at,
    batch_and_single,
    redelivered,
    service,
)
from tests.protocol.wire_driver import WireClient

MINUS_TWO = 2**64 - 2


@pytest.mark.parametrize("field", ["ledgerId", "entryId"])
async def test_an_ack_of_an_id_below_minus_one_is_refused_as_not_allowed(client: WireClient, field: str) -> None:
    batch, single = await batch_and_single(client)
    reply = await ack(client, {**single, field: MINUS_TWO})
    assert reply.error == pb.NotAllowedError, reply
    assert "names no entry" in reply.message
    # The connection goes on, and nothing was acknowledged.
    assert not (await ack(client, single)).HasField("error")
    assert await redelivered(client) == [(at(batch), [])]


async def test_a_redelivery_naming_an_id_below_minus_one_skips_it_and_redelivers_the_rest(client: WireClient) -> None:
    batch, single = await batch_and_single(client)
    client.send("REDELIVER_UNACKNOWLEDGED_MESSAGES", consumer_id=0,
                message_ids=[{"ledgerId": MINUS_TWO, "entryId": 0}, single])
    message_id = (await client.message())[0].message_id
    assert (message_id.ledgerId, message_id.entryId) == at(single)
    assert not (await ack(client, single, batch)).HasField("error")


@pytest.mark.parametrize("ledger_id, entry_id", [(MINUS_TWO, 0), (0, MINUS_TWO)])
async def test_a_seek_into_a_batch_at_an_id_below_minus_one_is_answered(client: WireClient, ledger_id: int,
                                                                         entry_id: int) -> None:
    """A seek names a position to start from: below -1 it is the earliest (ledger) or the
    entry's start (entry), as for any id before the stored ones, also with an ack set."""
    await batch_and_single(client)
    client.send("SEEK", consumer_id=0, request_id=9001,
                message_id={"ledgerId": ledger_id, "entryId": entry_id, "ack_set": [5]})
    await client.expect("CLOSE_CONSUMER")
    assert (await client.expect("SUCCESS")).request_id == 9001
