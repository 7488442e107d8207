"""Second review pass of the Spark stream source (spark_udfs.stream): findings, each driven
without Spark as Spark drives the reader (tests.spark.micro_batches)."""

from __future__ import annotations

import pytest

from spark_udfs.source import DataDirChangedError
from tests.spark.test_stream_fail_on_data_loss import A, B, NS, delete, send, stream


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_deleted_topic_leaves_the_offsets_once_its_deletion_is_told(tmp_path, fail_on_data_loss):
    """A topic deleted while a query ran stayed in every later offset (and its `$starts`) for
    good: the checkpointed offsets of a pattern over topics that come and go grew without bound.
    It leaves them, as a deleted partition leaves Kafka's; the deletion is still told (with
    failOnDataLoss) by the micro-batch that finds it gone, and the topic created again later is
    read from its beginning."""
    send(tmp_path, A, b"a")
    send(tmp_path, B, b"b")
    batches = stream(tmp_path, fail_on_data_loss, topics=NS + "loss-*")
    assert batches.next() == [b"a", b"b"]
    delete(tmp_path, A)
    if fail_on_data_loss:
        with pytest.raises(DataDirChangedError, match=f"{A} was deleted after the query read it up to"):
            batches.next()
        return
    assert batches.next() == []
    assert A not in batches.offset and A not in batches.offset["$starts"]
    assert B in batches.offset and B in batches.offset["$starts"]
    send(tmp_path, A, b"a-again")
    assert batches.next() == [b"a-again"]
