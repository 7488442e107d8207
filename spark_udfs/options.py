"""Options of the `pyengine` data source, parsed and checked before anything is read.

| option | default | meaning |
| --- | --- | --- |
| `path` (or `load(path)`) | required | the broker's data dir |
| `topics` | every topic | comma-separated names and patterns, or a list of them (`.option("topics", [...])` passes the list's `str()`, read back as a Python or JSON list of strings): a topic (`orders`, `public/default/orders`, `persistent://public/default/orders`, `segment://public/default/orders/0000-ffff-0`), a partitioned topic (its stored `-partition-N` topics, as its consumers read them), a scalable topic (`topic://public/default/orders`: its stored `segment://` topics), a namespace (`public/default`: its topics, segments included), or a glob over full names (`persistent://public/default/orders-*`, `public/default/orders-*` = `persistent://...`, `segment://public/default/orders/*`). A name that is not stored, or a pattern that matches nothing, is an error (a stream: a name not stored when it begins; one deleted later is no longer read, and a pattern may match nothing). |
| `isolation` | `read_committed` | `read_committed`: what a READ_COMMITTED consumer receives (no aborted or open txn's messages, nothing past the read horizon, no markers; v5 `segment://` topics: from the transaction records of the data dir's LMDB metadata store, see `spark_udfs.state`). `read_uncommitted`: every message, committed or not (PIP-31's READ_UNCOMMITTED); markers are control entries and stay out unless `includeMarkers`. |
| `includeMarkers` | `false` | with `read_uncommitted`: also the commit/abort marker rows (`is_marker` true), i.e. every stored entry (audits, or your own `committed_filter`) |
| `startPosition` | `earliest` | first position read, inclusive: `earliest`, `latest`, `LEDGER:ENTRY`, or a JSON object `{"topic": "LEDGER:ENTRY", ...}` (each key a topic that is read; others start at `earliest`) |
| `endPosition` | `latest` | last position read, inclusive (`latest`: the last entry stored when the query is planned), or a JSON object as for `startPosition`; `earliest` is refused |
| `maxBatchRows` | 65536 | rows per Arrow batch the reader yields (about) |
| `maxPartitionEntries` | 100000 | a ledger with more entries is read by several partitions |
| `maxEntriesPerTrigger` | none | streams only: at most about this many entries per micro-batch, shared among the topics (`spark_udfs.stream`) |
| `failOnDataLoss` | `false` | batch reads: `true` fails the read (`DataDirChangedError`) when a topic's explicit `startPosition` (`LEDGER:ENTRY`, a position the topic held: one of its message ids) comes before the first entry it still stores (or, none stored, before its current ledger): the entries from there on were trimmed by retention or the topic deleted since, and would silently be left out (as Spark's Kafka source with `failOnDataLoss=true`). Ledger ids are the data dir's, shared by its topics, so a position the topic never held (`0:0`) counts as trimmed too: start at `earliest` instead. `false`: the read starts at the first entry left, as a Pulsar reader does. `pyengine pipeline export` sets it. Streams: `true` fails a micro-batch when what it was to read is gone: a topic's entries after its offset trimmed by retention before it read them, a topic it read deleted (or deleted and created again), a topic that appeared since with its first entries trimmed, a chunked message whose first chunks were trimmed after the query read them (as Spark's Kafka source with `failOnDataLoss=true`, this may be a false alarm: for a topic deleted once read to its end, or a chunked message begun before the query's start or whose last chunk was sent again, once retention trimmed what the query read; see `spark_udfs.stream`); `false`: it reads on from what is left. |
| `filterPushdown` | `false` | `true`: comparisons on `topic`, `ledger_id` and `entry_id` narrow what is planned and read (see `spark_udfs.source`). Off by default: Spark 4.3 keeps the read plan of the last pushed-down scan on the loaded DataFrame and reuses it for its other scans, so with it on a DataFrame read again (unfiltered, or with other filters, or twice in one query) gets the rows of another scan's filters. Turn it on only for a DataFrame scanned once; narrowing by `topics`, `startPosition` and `endPosition` is always safe. |

A stream (`spark.readStream`, `spark_udfs.stream`) takes the same options but `endPosition` and
`filterPushdown`, which it refuses; `maxEntriesPerTrigger` is for streams only.
"""

from __future__ import annotations

import ast
import fnmatch
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from pyengine.errors import InvalidTopicNameError
from pyengine.naming import TopicName
from pyengine_kernels import Position

READ_COMMITTED = "read_committed"
READ_UNCOMMITTED = "read_uncommitted"
ISOLATIONS = (READ_COMMITTED, READ_UNCOMMITTED)
KNOWN = ("path", "paths", "topics", "isolation", "includemarkers", "startposition", "endposition",
         "maxbatchrows", "maxpartitionentries", "filterpushdown", "maxentriespertrigger", "failondataloss")
_SPELLING = {"includemarkers": "includeMarkers", "startposition": "startPosition", "endposition": "endPosition",
             "maxbatchrows": "maxBatchRows", "maxpartitionentries": "maxPartitionEntries",
             "filterpushdown": "filterPushdown", "maxentriespertrigger": "maxEntriesPerTrigger",
             "failondataloss": "failOnDataLoss"}


class OptionError(ValueError):
    """An option of the pyengine data source (or the pipeline CLI) is malformed."""


@dataclass(frozen=True)
class PositionSpec:
    """`earliest`, `latest`, or a position; per topic where a JSON object named topics."""

    default: Position | str
    per_topic: dict[str, Position | str] = field(default_factory=dict)

    def for_topic(self, topic: str) -> Position | str:
        return self.per_topic.get(topic, self.default)


@dataclass(frozen=True)
class ReadOptions:
    path: str
    topics: tuple[str, ...] | None          # patterns as given (resolved against the data dir later)
    isolation: str = READ_COMMITTED
    include_markers: bool = False
    start: PositionSpec = PositionSpec("earliest")
    end: PositionSpec = PositionSpec("latest")
    max_batch_rows: int = 65536
    max_partition_entries: int = 100_000
    filter_pushdown: bool = False
    max_entries_per_trigger: int | None = None      # streams only
    fail_on_data_loss: bool = False                 # see the table above (batch reads and streams)

    @property
    def read_committed(self) -> bool:
        return self.isolation == READ_COMMITTED


def parse_options(options: Mapping[str, str]) -> ReadOptions:
    """Check every option; raise OptionError naming the bad one."""
    given = {str(key).lower(): value for key, value in options.items()}
    unknown = sorted(set(given) - set(KNOWN))
    if unknown:
        known = ", ".join(_SPELLING.get(k, k) for k in KNOWN if k != "paths")
        raise OptionError(f"unknown option(s) {', '.join(unknown)} of the pyengine data source; known: {known}")
    path = given.get("path")
    if not path and given.get("paths"):
        paths = _list("paths", given["paths"])
        if len(paths) != 1:
            raise OptionError("the pyengine data source reads one data dir: give one path")
        path = paths[0]
    if not path:
        raise OptionError("the pyengine data source needs the broker's data dir: .load(DATA_DIR) or "
                          ".option('path', DATA_DIR)")
    isolation = str(given.get("isolation", READ_COMMITTED)).strip().lower()
    if isolation not in ISOLATIONS:
        raise OptionError(f"isolation must be one of {', '.join(ISOLATIONS)}, not {given['isolation']!r}")
    include_markers = _bool("includeMarkers", given.get("includemarkers", "false"))
    if include_markers and isolation == READ_COMMITTED:
        raise OptionError("includeMarkers needs isolation=read_uncommitted (READ_COMMITTED never shows markers)")
    topics = given.get("topics")
    patterns = tuple(_list("topics", topics)) if topics is not None else None
    if patterns is not None and not patterns:
        raise OptionError("topics is empty: name topics, a namespace (tenant/ns) or a pattern, or leave it out")
    start = parse_position_spec("startPosition", given.get("startposition", "earliest"))
    end = parse_position_spec("endPosition", given.get("endposition", "latest"))
    _check_start_before_end(start, end)
    return ReadOptions(
        path=str(path), topics=patterns, isolation=isolation, include_markers=include_markers,
        start=start, end=end,
        max_batch_rows=_positive("maxBatchRows", given.get("maxbatchrows", 65536)),
        max_partition_entries=_positive("maxPartitionEntries", given.get("maxpartitionentries", 100_000)),
        filter_pushdown=_bool("filterPushdown", given.get("filterpushdown", "false")),
        max_entries_per_trigger=(_positive("maxEntriesPerTrigger", given["maxentriespertrigger"])
                                 if given.get("maxentriespertrigger") is not None else None),
        fail_on_data_loss=_bool("failOnDataLoss", given.get("failondataloss", "false")),
    )


def _list(name: str, value) -> list[str]:
    """A list option: comma-separated, or a Python/JSON list or tuple of strings (what
    `.option(name, [...])` passes on: the list's `str()`, e.g. "['a', 'b']")."""
    if isinstance(value, (list, tuple)):
        items = value
    else:
        text = str(value).strip()
        if not text.startswith(("[", "(")):
            return [item.strip() for item in text.split(",") if item.strip()]
        try:
            items = ast.literal_eval(text)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            items = None
    if not isinstance(items, (list, tuple)) or not all(isinstance(item, str) for item in items):
        raise OptionError(f"{name}: cannot read {value!r} as a list of strings: give a Python or JSON list of "
                          "strings (['a', 'b']) or comma-separated names (a,b)")
    return [item.strip() for item in items if item.strip()]


def _bool(name: str, value) -> bool:
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise OptionError(f"{name} must be true or false, not {value!r}")


def _positive(name: str, value) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise OptionError(f"{name} must be a positive integer, not {value!r}") from None
    if number < 1:
        raise OptionError(f"{name} must be a positive integer, not {value!r}")
    return number


def parse_position(name: str, text: str) -> Position | str:
    value = str(text).strip()
    if value.lower() in ("earliest", "latest"):
        return value.lower()
    ledger, sep, entry = value.partition(":")
    try:
        if not sep:
            raise ValueError
        return Position(int(ledger), int(entry))
    except (ValueError, OverflowError):
        raise OptionError(f"{name} must be earliest, latest, LEDGER:ENTRY or a JSON object of them per topic, "
                          f"not {text!r}") from None


def parse_position_spec(name: str, text) -> PositionSpec:
    value = str(text).strip()
    if not value.startswith("{"):
        return PositionSpec(_bound(name, parse_position(name, value)))
    try:
        items = json.loads(value, object_pairs_hook=lambda pairs: _once(name, pairs))
    except json.JSONDecodeError as exc:
        raise OptionError(f"{name}: not a JSON object: {exc}") from exc
    except RecursionError:
        raise OptionError(f"{name}: not a JSON object of positions: nested too deeply") from None
    per_topic = {}
    for topic, position in items.items():
        normalized = _normalize(topic, name)
        if normalized in per_topic:
            raise OptionError(f"{name} names {normalized} twice (as {topic!r} too): give each topic once")
        per_topic[normalized] = _bound(f"{name}[{topic}]", parse_position(f"{name}[{topic}]", position))
    default = "earliest" if name == "startPosition" else "latest"
    return PositionSpec(default, per_topic)


def _once(name: str, pairs: list[tuple[str, object]]) -> dict:
    """A JSON object's pairs as a dict, a key given twice refused (json keeps the last one)."""
    items: dict = {}
    for key, value in pairs:
        if key in items:
            raise OptionError(f"{name} names {key!r} twice: give each topic once")
        items[key] = value
    return items


def _check_start_before_end(start: PositionSpec, end: PositionSpec) -> None:
    """Both given as positions, the start may not come after the end (as Spark's Kafka source
    refuses a starting offset past the ending one): such a read would silently be empty."""
    for topic in {None, *start.per_topic, *end.per_topic}:
        first = start.for_topic(topic) if topic is not None else start.default
        last = end.for_topic(topic) if topic is not None else end.default
        if isinstance(first, Position) and isinstance(last, Position) and first > last:
            where = f" for {topic}" if topic is not None else ""
            raise OptionError(f"startPosition {first} is after endPosition {last}{where}: nothing would be read")


def _bound(name: str, position: Position | str) -> Position | str:
    """`earliest` ends a read before its first entry: refused as an end (as Spark's Kafka
    source refuses it for endingOffsets), rather than read as an empty range."""
    if name.startswith("endPosition") and position == "earliest":
        raise OptionError(f"{name} cannot be earliest (nothing would be read): give latest or LEDGER:ENTRY")
    return position


def _normalize(name: str, option: str) -> str:
    try:
        return str(TopicName.parse(name))
    except InvalidTopicNameError as exc:
        raise OptionError(f"{option}: {exc}") from exc


def _partition_of(name: str) -> str | None:
    """The partitioned topic whose partition `name` is (`<topic>-partition-<n>`), else None."""
    try:
        topic = TopicName.parse(name)
    except InvalidTopicNameError:
        return None
    return str(topic.partitioned_topic) if topic.partition_index >= 0 else None


def _exact_topic(pattern: str, stored: list[str]) -> list[str]:
    """The stored topics `pattern` names exactly: itself, or a partitioned topic's partitions
    (a partitioned topic is stored as its partitions, which its consumers read)."""
    if "://" not in pattern and pattern.count("/") == 1:
        return []                                          # a namespace
    try:
        name = _normalize(pattern, "topics")
    except OptionError:
        return []
    if name in stored:
        return [name]
    return [stored_name for stored_name in stored if _partition_of(stored_name) == name]


def resolve_topics(patterns: tuple[str, ...] | None, stored: list[str], *, patterns_may_match_none: bool = False,
                   names_may_be_gone: bool = False) -> list[str]:
    """The stored topics the patterns name, in stored (name) order. Without patterns: every
    topic except system ones (local name starting with `__`). A pattern (glob, namespace,
    scalable topic) that matches nothing is an error, unless `patterns_may_match_none` (a
    stream: its topics may come later, or all be deleted, as with Kafka's subscribePattern);
    a topic named exactly that is not stored is too, unless `names_may_be_gone` (a stream
    that has begun: the topic was deleted while it ran, as Kafka's `subscribe` reads on)."""
    def is_system(name: str) -> bool:
        return name.rpartition("/")[2].startswith("__")

    if patterns is None:
        return [name for name in stored if not is_system(name)]
    chosen: set[str] = set()
    for pattern in patterns:
        exact = _exact_topic(pattern, stored)
        if exact:
            # A stored name (or a partitioned topic's partitions) named exactly: `?`, `*` and
            # `[` are allowed in topic names, so a name that has them is a glob only otherwise.
            matched = exact
        elif any(ch in pattern for ch in "*?["):
            full = pattern if "://" in pattern else f"persistent://{pattern}"
            matched = [name for name in stored if fnmatch.fnmatchcase(name, full) and not is_system(name)]
            if not matched and not patterns_may_match_none:
                raise OptionError(f"no stored topic matches {pattern!r}")
        elif "://" not in pattern and pattern.count("/") == 1:
            matched = [name for name in stored
                       if TopicName.parse(name).namespace_name == pattern and not is_system(name)]
            if not matched and not patterns_may_match_none:
                raise OptionError(f"namespace {pattern!r} has no stored topic")
        elif pattern.startswith("topic://"):
            scalable = _normalize(pattern, "topics")
            matched = [name for name in stored if name.startswith("segment://")
                       and str(TopicName.parse(name).scalable_topic) == scalable]
            if not matched and not patterns_may_match_none:
                raise OptionError(f"scalable topic {scalable!r} has no stored segment:// topic in this data dir")
        elif names_may_be_gone:                 # a topic name matching nothing stored (see above)
            _normalize(pattern, "topics")
            matched = []
        else:
            raise OptionError(f"unknown topic {_normalize(pattern, 'topics')!r}: it is not stored in this data dir")
        chosen.update(matched)
    return [name for name in stored if name in chosen]


__all__ = ["ISOLATIONS", "OptionError", "PositionSpec", "READ_COMMITTED", "READ_UNCOMMITTED", "ReadOptions",
           "parse_options", "parse_position", "resolve_topics"]
