"""`pyengine pipeline export`: a broker's topics to Parquet, READ_COMMITTED, through Spark.

    pyengine pipeline export --data-dir ./data --topics public/default --out ./export \\
        [--format parquet] [--master local[*]] [--isolation read_committed] [--mode error]

Reads the data dir read-only (safe while a broker serves it), every stored row of the topics
(`isolation=read_uncommitted` with the markers), and keeps what a READ_COMMITTED consumer
receives in one `mapInArrow` pass calling the Rust visibility kernel, with the transaction
state captured once here and broadcast. The read is bounded by the positions of that same
capture, so state and rows agree even while the broker appends; entries of the capture trimmed
by retention before Spark reads them fail the export (run it again) rather than go missing. Shows a progress bar (Spark
tasks done) on stderr and prints the counts: rows read, committed rows written, and the rows
dropped as aborted, uncommitted (open transactions and what waits behind them) or markers.
`--format delta` writes a Delta table when Delta Lake's jars are on Spark's classpath, and
otherwise stops before reading anything, saying what is missing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import threading
from pathlib import Path

from pyengine.storage.errors import StorageError

FORMATS = ("parquet", "delta")
DELTA_SOURCE = "org.apache.spark.sql.delta.sources.DeltaDataSource"      # Delta's `delta` format
DELTA_NEEDS = (
    "--format delta needs Delta Lake's JVM jars on Spark's classpath (io.delta:delta-spark_2.13 and "
    "io.delta:delta-storage, the release built for this Spark), and this Spark has no 'delta' data source: "
    "set PYSPARK_SUBMIT_ARGS='--packages io.delta:delta-spark_2.13:VERSION pyspark-shell' (downloads them "
    "from Maven Central) or '--jars /path/delta-spark.jar,/path/delta-storage.jar pyspark-shell', or copy "
    "the jars into pyspark's jars directory. --format parquet needs nothing more")
MODES = ("error", "overwrite", "append")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pipeline", help="Spark pipelines over a data dir (export)")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    e = actions.add_parser("export", help="write topics READ_COMMITTED to Parquet with Spark")
    e.add_argument("--data-dir", type=Path, required=True, help="the broker's data dir (opened read-only)")
    e.add_argument("--topics", default=None,
                   help="comma-separated topics, namespaces (tenant/ns) or globs; default: every topic")
    e.add_argument("--out", type=Path, required=True, help="output directory")
    e.add_argument("--format", choices=FORMATS, default="parquet",
                   help="parquet, or delta (needs Delta Lake's jars on Spark's classpath)")
    e.add_argument("--master", default="local[*]", help="Spark master (local[*], spark://host:7077, yarn, ...)")
    e.add_argument("--isolation", choices=("read_committed", "read_uncommitted"), default="read_committed")
    e.add_argument("--mode", choices=MODES, default="error",
                   help="when --out exists: fail (error), replace it (overwrite) or add files (append)")
    e.add_argument("--start-position", default="earliest", help="earliest, LEDGER:ENTRY or a JSON object per topic")
    e.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    e.add_argument("--json", action="store_true", help="print the counts as one JSON object instead")


def run(args: argparse.Namespace) -> int:
    from spark_udfs.options import OptionError
    from spark_udfs.state import MetadataBackendError

    try:
        return export(args)
    except (OptionError, StorageError, MetadataBackendError) as exc:
        raise SystemExit(f"pyengine pipeline export: {exc}") from None


def _plan(args: argparse.Namespace):
    """Everything checked and the state captured before Spark starts: bad input costs no JVM."""
    from pyengine_kernels import Position
    from spark_udfs.options import OptionError, parse_options, resolve_topics
    from spark_udfs.source import first_stored
    from spark_udfs.state import open_snapshot

    options = {"path": str(args.data_dir), "startPosition": args.start_position}
    if args.topics is not None:
        options["topics"] = args.topics
    parsed = parse_options(options)
    if args.out.exists() and args.mode == "error":
        raise SystemExit(f"pyengine pipeline export: {args.out} exists (--mode overwrite or append)")
    with open_snapshot(args.data_dir) as snapshot:
        names = resolve_topics(parsed.topics, snapshot.topic_names())
        if not names:
            # Only without --topics (a pattern matching nothing is refused above): Spark would
            # be started to fail on an empty topic list, with its traceback.
            raise OptionError(f"{args.data_dir} stores no topic to export (system topics aside)")
        stray = sorted(set(parsed.start.per_topic) - set(names))
        if stray:           # the per-topic starts below name only the topics read
            raise OptionError(f"--start-position names {', '.join(map(repr, stray))}, which is not among the "
                              "topics exported: name a topic exported, as stored (a partition, a segment)")
        infos = {name: snapshot.view.topic(name) for name in names}
        state = snapshot.state(names)
    ends = {name: f"{info.last_position.ledger_id}:{info.last_position.entry_id}" for name, info in infos.items()}
    # Spark plans the read in a snapshot of its own: its start is pinned to the first entry of
    # this capture (failOnDataLoss), so entries trimmed in between fail the read rather than
    # being silently left out.
    starts = {}
    for name, info in infos.items():
        start = parsed.start.for_topic(name)
        stored = first_stored(info, Position.EARLIEST if start == "earliest" else start) if start != "latest" else None
        if stored is None and isinstance(start, Position):
            # Nothing stored at or after the start (ledger ids are the data dir's, and one
            # start applies to every topic): read nothing of it, in Spark's snapshot too. As
            # a start after the pinned end, the source would refuse the whole read.
            starts[name] = ends[name] = "latest"
            continue
        starts[name] = f"{stored.ledger_id}:{stored.entry_id}" if stored is not None else str(start)
    return names, state, ends, starts


def export(args: argparse.Namespace) -> int:
    names, state, ends, starts = _plan(args)
    import spark_udfs
    from pyspark.sql import SparkSession
    from spark_udfs.udfs import COUNTS, committed_rows

    owned = SparkSession.getActiveSession() is None
    # Our bar replaces Spark's console progress (the two would overwrite each other's line).
    spark = spark_udfs.session(args.master, app_name="pyengine-pipeline-export",
                               conf={"spark.ui.showConsoleProgress": "false"})
    try:
        if args.format == "delta" and not spark._jvm.org.apache.spark.util.Utils.classIsLoadable(DELTA_SOURCE):
            raise SystemExit(f"pyengine pipeline export: {DELTA_NEEDS}")      # before anything is read
        context = spark.sparkContext
        counts = {name: context.accumulator(0) for name in COUNTS}
        raw = spark_udfs.read(spark, str(args.data_dir), topics=names, isolation="read_uncommitted",
                              includeMarkers=True, startPosition=json.dumps(starts), endPosition=json.dumps(ends),
                              failOnDataLoss=True)
        rows = committed_rows(raw, state if args.isolation == "read_committed" else None, counts)
        mode = "errorifexists" if args.mode == "error" else args.mode
        try:
            with _Progress(context, enabled=not args.no_progress):
                rows.write.mode(mode).format(args.format).save(str(args.out))
        except Exception as exc:
            # Raised in Spark's Python processes, it comes back as Spark's error with the trace.
            changed = _data_dir_changed(str(exc))
            if changed is None:
                raise
            if args.mode == "error":
                with contextlib.suppress(OSError):      # the empty dir Spark made: not in the way of a retry
                    args.out.rmdir()
            raise SystemExit(f"pyengine pipeline export: the data dir changed during the export: {changed}; "
                             "run the export again") from None
    finally:
        if owned:
            spark.stop()
    tally = {name: accumulator.value for name, accumulator in counts.items()}
    result = {"rows_read": sum(tally.values()), "rows_written": tally["visible"], "aborted_dropped": tally["aborted"],
              "uncommitted_dropped": tally["uncommitted"], "markers_dropped": tally["marker"],
              "topics": len(names), "out": str(args.out), "format": args.format, "isolation": args.isolation}
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print(f"topics: {len(names)}\nrows read: {result['rows_read']:,}\n"
              f"{'committed ' if args.isolation == 'read_committed' else ''}rows written: {result['rows_written']:,}\n"
              f"dropped: {result['aborted_dropped']:,} aborted, {result['uncommitted_dropped']:,} uncommitted, "
              f"{result['markers_dropped']:,} markers\nwrote {args.format} to {args.out}")
    return 0


def _data_dir_changed(error: str) -> str | None:
    """The message of a DataDirChangedError in the text of a Spark error (None: none is).
    Its subclasses too: the traceback names the class raised (PlannedEntriesGoneError, ...)."""
    from spark_udfs.source import DataDirChangedError

    names = "|".join(cls.__name__ for cls in (DataDirChangedError, *DataDirChangedError.__subclasses__()))
    found = re.search(rf"\b(?:{names}): ([^\n]*)", error)
    return found.group(1).strip() if found else None


class _Progress:
    """A progress bar of the Spark tasks done in the running stages, on stderr."""

    WIDTH = 30

    def __init__(self, context, enabled: bool = True, interval: float = 0.5) -> None:
        self.tracker = context.statusTracker()
        self.enabled = enabled
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pipeline-progress", daemon=True)
        self._shown = False
        self._total = 0

    def __enter__(self) -> _Progress:
        if self.enabled:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self._stop.set()
            self._thread.join()
            if self._shown and exc[0] is None:
                self.render(self._total, self._total)       # the last poll may predate the end
            if self._shown:
                sys.stderr.write("\n")
                sys.stderr.flush()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            done = total = 0
            for stage_id in self.tracker.getActiveStageIds():
                info = self.tracker.getStageInfo(stage_id)
                if info is not None:
                    done += info.numCompletedTasks
                    total += info.numTasks
            if total:
                self.render(done, total)

    def render(self, done: int, total: int) -> None:
        self._total = total
        filled = self.WIDTH * done // total
        sys.stderr.write(f"\rexport [{'#' * filled}{'.' * (self.WIDTH - filled)}] {done}/{total} tasks")
        sys.stderr.flush()
        self._shown = True
