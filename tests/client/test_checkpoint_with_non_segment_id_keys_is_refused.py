"""subscribe_checkpoint(checkpoint=...) refuses keys that are not segment ids (ints), before
anything is opened. Found by an audit: only the values were checked, so a checkpoint whose
keys had become strings (saved as JSON and loaded back: {"0": ...}) was taken, matched no
segment, and the consumer silently read every segment from its start again."""

from __future__ import annotations

import pytest

from pyengine.client import Client, MessageId


@pytest.mark.parametrize("key", ["0", 1.0, True, -1], ids=["str", "float", "bool", "negative"])
async def test_a_checkpoint_key_that_is_no_segment_id_is_refused(key):
    async with Client("pulsar://127.0.0.1:1", operation_timeout_seconds=1) as client:   # nothing listens
        with pytest.raises((TypeError, ValueError), match="segment id"):
            await client.subscribe_checkpoint("topic://public/default/cp", "s", "c",
                                              checkpoint={key: MessageId(1, 2, -1, -1)})
