"""new_transaction(timeout_ms=...) past what NEW_TXN can carry (a uint64 field) is refused at
once with an error naming timeout_ms. Found by an audit: the coordinators were found and
connected first, then protobuf raised "Value out of range: <n>" while building the request,
an error that names neither the argument nor the call."""

from __future__ import annotations

import pytest

from pyengine.client import Client


@pytest.mark.parametrize("timeout_ms", [2**64, 10**20])
async def test_a_timeout_too_large_for_the_wire_is_refused_by_name(timeout_ms):
    async with Client("pulsar://127.0.0.1:1", operation_timeout_seconds=1) as client:   # nothing listens
        with pytest.raises(ValueError, match="timeout_ms"):
            await client.new_transaction(timeout_ms=timeout_ms)
