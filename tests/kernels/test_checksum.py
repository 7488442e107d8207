"""CRC32C and its C entry point, against google-crc32c (the oracle)."""

from __future__ import annotations

import ctypes
import itertools

import google_crc32c
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import pyengine_kernels as k
from pyengine_kernels import _kernels

CAPSULE_NAME = b"pyengine_kernels._kernels._crc32c_capi"
CRC_FN = ctypes.CFUNCTYPE(ctypes.c_uint32, ctypes.c_uint32, ctypes.c_char_p, ctypes.c_size_t)


def capsule_function():
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype = ctypes.c_void_p
    get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return CRC_FN(get_pointer(_kernels._crc32c_capi, CAPSULE_NAME))


def test_check_value() -> None:
    assert k.crc32c(b"123456789") == 0xE3069283
    assert k.crc32c(b"") == 0
    assert k.crc32c(b"", 0xDEADBEEF) == 0xDEADBEEF


# Sizes around the crate's 768-byte interleaved blocks and 8-byte words matter most.
payloads = st.one_of(st.binary(max_size=64), st.binary(min_size=700, max_size=3000))


@given(payloads, st.lists(st.integers(0, 3000), max_size=4), st.integers(0, 2**32 - 1))
def test_chained_extends_match_google_crc32c(data: bytes, cuts: list[int], value: int) -> None:
    bounds = [0, *sorted(min(cut, len(data)) for cut in cuts), len(data)]
    ours = value
    for start, end in itertools.pairwise(bounds):
        ours = k.crc32c(data[start:end], ours)
    assert ours == google_crc32c.extend(value, data)


def test_reads_any_contiguous_buffer_in_place() -> None:
    words = np.arange(100, dtype=np.int64)
    expected = google_crc32c.value(words.tobytes())
    assert k.crc32c(words) == expected
    assert k.crc32c(memoryview(words.tobytes())[8:]) == google_crc32c.value(words.tobytes()[8:])
    assert k.crc32c(bytearray(b"123456789")) == 0xE3069283


@pytest.mark.parametrize(
    "args, error",
    [
        (("123456789",), TypeError),
        ((None,), TypeError),
        ((b"x", -1), OverflowError),
        ((b"x", 2**32), OverflowError),
        ((np.arange(10)[::2],), BufferError),
    ],
)
def test_rejects_bad_arguments(args, error: type[Exception]) -> None:
    with pytest.raises(error):
        k.crc32c(*args)


@given(st.binary(max_size=2000), st.integers(0, 2**32 - 1))
def test_capsule_function_is_the_same_crc(data: bytes, value: int) -> None:
    assert capsule_function()(value, data, len(data)) == google_crc32c.extend(value, data)


def test_capsule_is_named_for_its_attribute() -> None:
    is_valid = ctypes.pythonapi.PyCapsule_IsValid
    is_valid.restype = ctypes.c_int
    is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
    assert is_valid(_kernels._crc32c_capi, CAPSULE_NAME) == 1
    assert is_valid(_kernels._crc32c_capi, b"another.name") == 0
