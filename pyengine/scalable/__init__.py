"""Scalable topics (PIP-468): a topic:// name backed by a DAG of segment:// topics over the key-hash
range, split and merged by a leader-elected controller that keeps its state in the metadata store.

- layout.py      HashRange, SegmentInfo, SegmentLayout (the immutable DAG) and key hashing
- resources.py   the metadata-store paths and records (layout, controller lock, subscriptions,
                 consumer sessions, the split/merge in progress)
- segments.py    SegmentOperations (the Segments admin API as the controller uses it), LocalSegments
- coordinator.py SubscriptionCoordinator: round-robin assignment, consumer sessions, grace period
- controller.py  ScalableTopicController: leader election, split/merge with crash recovery
- service.py     ScalableTopicService: the broker's controllers, topic creation and deletion
"""

from pyengine.scalable.layout import (
    HashRange,
    LayoutError,
    SegmentInfo,
    SegmentLayout,
    SegmentNotFoundError,
    SegmentState,
    key_hash,
)

__all__ = ["HashRange", "LayoutError", "SegmentInfo", "SegmentLayout", "SegmentNotFoundError", "SegmentState", "key_hash"]
