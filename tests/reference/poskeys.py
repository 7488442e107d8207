"""Pure-Python reference of ``core_ext.poskeys``, the oracle of the differential tests.

Flipping the sign bit of a two's complement int64 is adding 2**63 to it: [-2**63, 2**63) maps
monotonically onto [0, 2**64), whose big-endian bytes sort like the numbers.
"""

from __future__ import annotations

import operator
import struct

SIGN_BIT = 1 << 63
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def _check(value) -> int:
    value = operator.index(value)
    if not INT64_MIN <= value <= INT64_MAX:
        raise OverflowError(f"{value} is outside the signed 64-bit range")
    return value


def pack_i64(value) -> bytes:
    return struct.pack(">Q", _check(value) + SIGN_BIT)


def unpack_i64(key) -> int:
    key = bytes(key)
    if len(key) != 8:
        raise ValueError("an int64 key has 8 bytes")
    return struct.unpack(">Q", key)[0] - SIGN_BIT


def pack_position(ledger_id, entry_id) -> bytes:
    return pack_i64(ledger_id) + pack_i64(entry_id)


def unpack_position(key) -> tuple[int, int]:
    key = bytes(key)
    if len(key) != 16:
        raise ValueError("a position key has 16 bytes")
    return unpack_i64(key[:8]), unpack_i64(key[8:])


def pack_positions(ledger_ids, entry_ids) -> list[bytes]:
    ledger_ids, entry_ids = list(ledger_ids), list(entry_ids)
    if len(ledger_ids) != len(entry_ids):
        raise ValueError("length mismatch")
    pairs = zip(ledger_ids, entry_ids, strict=True)
    return [pack_position(ledger, entry) for ledger, entry in pairs]
