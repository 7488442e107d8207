"""`decode_entries` and `chunk_indices` take ledger and entry ids as integers of int64's range,
and refuse others instead of casting them.

The ids were cast to int64 unchecked: floats lost their fraction (1.7 named the rows of ledger
1) and unsigned ids past int64 wrapped to negative ones, silently naming rows, and chunks, after
entries they are not.
"""

from __future__ import annotations

import numpy as np
import pytest

from core_ext.records import chunk_indices, decode_entries
from pyengine.protocol.commands import message_metadata
from pyengine.storage.entry import encode_entry, headers_and_payload

INT64_MAX = 2**63 - 1
VALUE = encode_entry(headers_and_payload(message_metadata("p", 1, 5).SerializeToString(), b"x"))
CALLS = pytest.mark.parametrize("call", [decode_entries, chunk_indices], ids=["decode_entries", "chunk_indices"])


@CALLS
@pytest.mark.parametrize("ids, error", [
    ([1.7], TypeError),
    ([1, 2.0], TypeError),
    (np.array([1.0]), TypeError),
    (np.array([True]), TypeError),
    (["1"], TypeError),
    (np.array([INT64_MAX + 1], np.uint64), ValueError),
    ([INT64_MAX + 1], ValueError),
    ([-1, INT64_MAX + 1], ValueError),            # NumPy reads these as floats
    ([2**64], ValueError),                        # and this as an object
])
@pytest.mark.parametrize("which", ["ledger_ids", "entry_ids"])
def test_ids_a_cast_would_change_are_refused(call, ids, error, which):
    others = [0] * len(ids)
    args = (ids, others) if which == "ledger_ids" else (others, ids)
    with pytest.raises(error, match=which):
        call(*args, [VALUE] * len(ids))


@pytest.mark.parametrize("ids", [
    [3, INT64_MAX], (3, INT64_MAX), np.array([3, INT64_MAX]), [np.int32(3), np.uint64(INT64_MAX)],
    np.array([3, 2**32], np.uint64), np.array([3, 7], np.int8)[::1],
])
def test_integer_ids_of_any_type_name_their_rows(ids):
    expected = [int(i) for i in ids]
    columns = decode_entries(ids, ids, [VALUE, VALUE])
    assert columns["ledger_id"].tolist() == expected and columns["entry_id"].tolist() == expected
    assert chunk_indices(ids, ids, [VALUE, VALUE]).tolist() == []


@CALLS
def test_no_ids_of_any_dtype(call):
    call([], np.array([], np.float64), [])
