"""The segment DAG as the wire's ScalableTopicDAG (PIP-468 protocol messages) and back."""

from __future__ import annotations

from pyengine.protocol import pulsar_api_pb2 as pb
from pyengine.scalable.layout import HashRange, LayoutError, SegmentInfo, SegmentLayout, SegmentState

_STATE_TO_WIRE = {SegmentState.ACTIVE: pb.SEGMENT_ACTIVE, SegmentState.SEALED: pb.SEGMENT_SEALED}
_STATE_FROM_WIRE = {v: k for k, v in _STATE_TO_WIRE.items()}


def layout_to_dag(layout: SegmentLayout, controller_url: str | None, segment_brokers: dict[int, str],
                  dag: pb.ScalableTopicDAG | None = None) -> pb.ScalableTopicDAG:
    dag = dag if dag is not None else pb.ScalableTopicDAG()
    dag.epoch = layout.epoch
    dag.next_segment_id = layout.next_segment_id
    for sid, info in sorted(layout.all_segments.items()):
        segment = dag.segments.add()
        segment.segment_id = sid
        segment.hash_start, segment.hash_end = info.hash_range.start, info.hash_range.end
        segment.state = _STATE_TO_WIRE[info.state]
        segment.parent_ids.extend(info.parent_ids)
        segment.child_ids.extend(info.child_ids)
        segment.created_at_epoch = info.created_at_epoch
        segment.sealed_at_epoch = info.sealed_at_epoch
    for sid, url in sorted(segment_brokers.items()):
        address = dag.segment_brokers.add()
        address.segment_id = sid
        address.broker_url = url
    if controller_url:
        dag.controller_broker_url = controller_url
    return dag


def dag_to_layout(dag: pb.ScalableTopicDAG) -> tuple[SegmentLayout, str | None, dict[int, str]]:
    """(layout, controller URL, broker URL per active segment); LayoutError when inconsistent."""
    segments = {}
    for segment in dag.segments:
        if segment.state not in _STATE_FROM_WIRE:
            raise LayoutError(f"segment {segment.segment_id}: unknown state {segment.state}")
        if segment.segment_id in segments:      # which record holds is anyone's guess
            raise LayoutError(f"segment {segment.segment_id} is listed twice")
        segments[segment.segment_id] = SegmentInfo(
            segment.segment_id, HashRange(segment.hash_start, segment.hash_end), _STATE_FROM_WIRE[segment.state],
            tuple(segment.parent_ids), tuple(segment.child_ids), segment.created_at_epoch, segment.sealed_at_epoch)
    next_id = dag.next_segment_id if dag.HasField("next_segment_id") else max(segments, default=-1) + 1
    layout = SegmentLayout(dag.epoch, next_id, segments)
    layout.check()
    controller = dag.controller_broker_url if dag.HasField("controller_broker_url") else None
    return layout, controller, {a.segment_id: a.broker_url for a in dag.segment_brokers}
