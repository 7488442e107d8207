"""Findings of a review of the Spark pipeline (spark_udfs): each test failed before its fix."""

from __future__ import annotations

import pytest

from spark_udfs.source import DataDirChangedError
from tests.spark.test_stream_fail_on_data_loss import A, B, delete, send, stream


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_topic_named_exactly_deleted_while_the_stream_runs(tmp_path, fail_on_data_loss):
    """A stream of topics named exactly (not a pattern) failed every micro-batch once one of
    them was deleted (OptionError "unknown topic": the names were resolved again, as at the
    start, for each micro-batch), so the query could never go on, also from its checkpoint.
    Now the deleted topic is no longer read, as the module doc says and as Kafka's `subscribe`
    reads on; failOnDataLoss tells the deletion, as for a pattern's topic."""
    send(tmp_path, A, b"a")
    send(tmp_path, B, b"b")
    batches = stream(tmp_path, fail_on_data_loss, topics=f"{A},{B}")
    assert batches.next() == [b"a", b"b"]
    delete(tmp_path, A)
    send(tmp_path, B, b"b2")
    if fail_on_data_loss:
        with pytest.raises(DataDirChangedError, match=f"{A} was deleted after the query read it up to"):
            batches.next()
    else:
        assert batches.next() == [b"b2"]
        send(tmp_path, A, b"again")              # created again: read from its beginning
        assert batches.next() == [b"again"]


def test_a_null_entry_id_is_named_as_such():
    """Null ids in the rows a committed filter judges are refused: a null entry id was reported
    as a null ledger id."""
    import pyarrow as pa

    from spark_udfs.state import _int64_numpy

    with pytest.raises(ValueError, match="entry ids must not be null"):
        _int64_numpy(pa.array([1, None], pa.int64()), "entry ids")
    assert _int64_numpy(pa.chunked_array([[1], [2]], pa.int64()), "ledger ids").tolist() == [1, 2]
