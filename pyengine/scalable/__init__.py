"""Scalable topics (PIP-468): a topic:// name backed by a DAG of segment:// topics over the key-hash
range, split and merged by a leader-elected controller that keeps its state in the metadata store.

- layout.py      HashRange, SegmentInfo, SegmentLayout (the immutable DAG) and key hashing
"""

from pyengine.scalable.layout import HashRange, LayoutError, SegmentInfo, SegmentLayout, SegmentState, key_hash

__all__ = ["HashRange", "LayoutError", "SegmentInfo", "SegmentLayout", "SegmentState", "key_hash"]
