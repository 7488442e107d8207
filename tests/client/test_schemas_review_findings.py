"""Review findings in the client's schema calls."""

from __future__ import annotations

import pytest

from pyengine.client import Client

TOPIC = "persistent://public/default/typed"


async def test_a_schema_version_past_int64_is_a_value_error(client: Client) -> None:
    """get_schema_info(version=2**63) raised struct.error from packing the version for the
    wire (not a ValueError as the other bad arguments): versions are int64 on the wire."""
    with pytest.raises(ValueError, match="version"):
        await client.get_schema_info(TOPIC, 2**63)
