"""SUBSCRIBE of a Key_Shared Sticky consumer with bad hash ranges, from any client: the clients
check ranges before subscribing, the broker checks them again (the wire carries whatever was
sent) and answers ConsumerAssignError, as Pulsar's HashRangeExclusiveStickyKeyConsumerSelector.
The connection and the subscription's other consumers go on."""

from __future__ import annotations

import pytest

from pyengine.protocol import pulsar_api_pb2 as pb
from tests.protocol.wire_driver import WireClient

TOPIC = "persistent://public/default/sticky"
Sub = pb.CommandSubscribe


def meta(*ranges: tuple[int, int]) -> dict:
    return {"keySharedMode": pb.STICKY, "hashRanges": [{"start": s, "end": e} for s, e in ranges]}


@pytest.mark.parametrize("ranges, match", [
    ((), "must not be empty"),
    (((10, 5),), "start > end"),
    (((0, 10), (5, 20)), "Range conflict"),                    # its own ranges overlap
    (((100, 200),), "Range conflict with consumer 'first'"),   # the first consumer's
])
async def test_bad_sticky_ranges_are_answered_consumer_assign_error(client: WireClient, ranges, match) -> None:
    first = await client.subscribe(TOPIC, "ks", consumer_id=1, request_id=1, sub_type=Sub.Key_Shared,
                                   consumer_name="first", keySharedMeta=meta((150, 300)))
    assert first.DESCRIPTOR.name == "CommandSuccess", first
    reply = await client.subscribe(TOPIC, "ks", consumer_id=2, request_id=2, sub_type=Sub.Key_Shared,
                                   consumer_name="second", keySharedMeta=meta(*ranges))
    assert (reply.request_id, reply.error) == (2, pb.ConsumerAssignError)
    assert match in reply.message
    # the connection goes on: a consumer with free ranges joins
    third = await client.subscribe(TOPIC, "ks", consumer_id=3, request_id=3, sub_type=Sub.Key_Shared,
                                   consumer_name="third", keySharedMeta=meta((301, 400)))
    assert third.DESCRIPTOR.name == "CommandSuccess", third


async def test_an_auto_split_consumer_beside_sticky_ones_is_answered_consumer_busy(client: WireClient) -> None:
    await client.subscribe(TOPIC, "ks", consumer_id=1, request_id=1, sub_type=Sub.Key_Shared,
                           keySharedMeta=meta((0, 65535)))
    reply = await client.subscribe(TOPIC, "ks", consumer_id=2, request_id=2, sub_type=Sub.Key_Shared)
    assert (reply.request_id, reply.error) == (2, pb.ConsumerBusy)
    assert "key_shared mode 'STICKY' is different" in reply.message
