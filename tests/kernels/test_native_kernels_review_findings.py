"""Findings of the native-kernels review (pyengine_kernels): each test failed before its fix.

The Rust fixes were written without a rebuild of the shared kernels: run these after one."""

from __future__ import annotations

import struct

import pyroaring
import pytest

from pyengine_kernels import AbortedTxnSet


def test_from_bytes_refuses_a_bitmap_holding_an_empty_32_bit_bitmap():
    """A coordinator's 64-bit bitmap is a map of 32-bit bitmaps (high half -> low halves); one
    of them empty is an encoding `to_bytes` never produces (the writer drops emptied ones), yet
    `from_bytes` took it as canonical, since the set it loaded wrote it back the same way: two
    encodings of one set, against the documented contract."""
    treemap = (struct.pack("<Q", 2)
               + struct.pack("<I", 0) + pyroaring.BitMap().serialize()
               + struct.pack("<I", 1) + pyroaring.BitMap([5]).serialize())
    data = b"PEAB\x01" + struct.pack("<QqQ", 1, 3, len(treemap)) + treemap + struct.pack("<qq", 1, 2)
    with pytest.raises(ValueError, match="non-canonical"):
        AbortedTxnSet.from_bytes(data)
