"""The Pulsar binary protocol as pyengine speaks it.

* ``pulsar_api.proto`` -- the project's own definition of every command, enum and metadata message
  (wire facts from /work/shared/protocol/pulsar-wire-protocol.md, section 2).
* ``pulsar_api_pb2`` (.py / .pyi) -- generated from it by ``scripts/gen-proto``; never edit by hand.
* ``commands`` -- the small shared helpers: build / serialize / parse ``BaseCommand`` envelopes and
  ``MessageMetadata`` (including transaction markers), raising :class:`ProtocolError` on bad input.

Framing (length prefixes, checksums, payloads) is not handled here.
"""

from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.protocol.commands import (
    ProtocolError,
    base_command,
    command_body,
    marker_metadata,
    message_metadata,
    parse_command,
    parse_message_metadata,
    serialize_command,
)

__all__ = [
    "ProtocolError",
    "base_command",
    "command_body",
    "marker_metadata",
    "message_metadata",
    "parse_command",
    "parse_message_metadata",
    "pb",
    "serialize_command",
]
