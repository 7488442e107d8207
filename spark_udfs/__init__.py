"""PySpark data source and Arrow UDFs that read pyengine topics READ_COMMITTED.

Reading a broker's data dir (read-only, safe while the broker runs)::

    import spark_udfs

    spark = spark_udfs.session("local[*]")        # or register(an existing session)
    orders = (spark.read.format("pyengine")
              .option("topics", "public/default/orders-*")     # names, namespaces, globs
              .load("/var/lib/pyengine/data"))                  # isolation=read_committed
    orders.groupBy("key").count().show()

As a stream (`spark.readStream.format("pyengine")`, the same options but `endPosition`):
each micro-batch reads what became readable since the last one (`spark_udfs.stream`).

The rows are exactly what a READ_COMMITTED consumer receives, one per message (batches are
expanded): nothing of aborted or still-open transactions, nothing past a topic's read horizon,
no commit/abort markers. `isolation=read_uncommitted` gives every message (committed or not);
`includeMarkers=true` adds the marker rows. Columns: `spark_udfs.SCHEMA` (topic, ledger_id,
entry_id, batch_index, publish_time, event_time, key, value, properties, producer_name,
sequence_id, txnid_most, txnid_least, is_marker). Options: `spark_udfs.options`.

Both transaction designs: v4 (PIP-31) topics carry their state in the stream (markers, the
buffer's snapshot); v5 (PIP-473) `segment://` topics keep it in the metadata store, which the
source reads from the data dir's LMDB metadata store in the same snapshot as the entries
(`topics="topic://tenant/ns/name"` names every segment of a scalable topic). A data dir whose
broker kept its metadata in etcd has no v5 state inside: READ_COMMITTED over its v5 topics is
refused with `MetadataBackendError` (READ_UNCOMMITTED works).

Your own DataFrames (e.g. every stored row, exported earlier) filtered the same way, by an
Arrow UDF calling the Rust visibility kernel, with the transaction state captured once on the
driver and broadcast::

    state = spark_udfs.capture_state("/var/lib/pyengine/data")     # a consistent snapshot
    raw = spark.read.parquet("/exports/orders-raw")                  # rows with the 5 columns
    committed = spark_udfs.committed_filter(raw, state)
    # or as a column: raw.withColumn("visible", spark_udfs.committed_column(state))
    # or as one mapInArrow pass: spark_udfs.committed_rows(raw, state)

The state must cover every topic the DataFrame holds rows of (ledger ids name the topic);
rows of ledgers created after the capture count as not visible yet.

Workers: `session()` points `PYSPARK_PYTHON` at the running interpreter when it is unset. On a
cluster (`session("spark://host:7077")`, `--master yarn`, ...) every executor's Python needs
pyengine and its native builds: install the same wheels there (`pip install pyengine
pyengine-kernels`, built by `make setup` / maturin), or ship a packed virtualenv with
`spark.archives=pyenv.tar.gz#environment` and `PYSPARK_PYTHON=./environment/bin/python`. The
data dir must be reachable at the same path on the executors, on a local filesystem (LMDB
needs working mmap and file locks: not NFS), so in practice the executors run on the broker's
host.
"""

from spark_udfs.options import ISOLATIONS, OptionError
from spark_udfs.schema import ARROW_SCHEMA, SCHEMA, VISIBILITY_COLUMNS
from spark_udfs.session import read, register, session
from spark_udfs.source import PyengineDataSource
from spark_udfs.state import MetadataBackendError, TopicState, TxnState, capture_state
from spark_udfs.udfs import committed_batches, committed_column, committed_filter, committed_rows, committed_udf

__all__ = [
    "ARROW_SCHEMA", "ISOLATIONS", "MetadataBackendError", "OptionError", "PyengineDataSource", "SCHEMA",
    "TopicState", "TxnState", "VISIBILITY_COLUMNS", "capture_state", "committed_batches", "committed_column", "committed_filter",
    "committed_rows", "committed_udf", "read",
    "register", "session",
]
