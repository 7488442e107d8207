"""Null ids in the rows a committed filter judges are refused, each named as what it is."""

from __future__ import annotations

import pyarrow as pa
import pytest

from spark_udfs.state import _int64_numpy


def test_a_null_entry_id_is_named_as_such():
    """A null entry id was reported as a null ledger id."""
    with pytest.raises(ValueError, match="entry ids must not be null"):
        _int64_numpy(pa.array([1, None], pa.int64()), "entry ids")
    with pytest.raises(ValueError, match="ledger ids must not be null"):
        _int64_numpy(pa.chunked_array([[None], [2]], pa.int64()), "ledger ids")
    assert _int64_numpy(pa.chunked_array([[1], [2]], pa.int64()), "ledger ids").tolist() == [1, 2]
