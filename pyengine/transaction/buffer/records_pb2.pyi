from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CoordinatorRecord(_message.Message):
    __slots__ = ("coordinator_id", "low_watermark", "committed", "aborted", "committed_unmarked")
    COORDINATOR_ID_FIELD_NUMBER: _ClassVar[int]
    LOW_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    ABORTED_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_UNMARKED_FIELD_NUMBER: _ClassVar[int]
    coordinator_id: int
    low_watermark: int
    committed: _containers.RepeatedScalarFieldContainer[int]
    aborted: _containers.RepeatedScalarFieldContainer[int]
    committed_unmarked: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, coordinator_id: _Optional[int] = ..., low_watermark: _Optional[int] = ..., committed: _Optional[_Iterable[int]] = ..., aborted: _Optional[_Iterable[int]] = ..., committed_unmarked: _Optional[_Iterable[int]] = ...) -> None: ...

class SnapshotSegmentRecord(_message.Message):
    __slots__ = ("last_marker_ledger_id", "last_marker_entry_id", "aborted_count")
    LAST_MARKER_LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_MARKER_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    ABORTED_COUNT_FIELD_NUMBER: _ClassVar[int]
    last_marker_ledger_id: int
    last_marker_entry_id: int
    aborted_count: int
    def __init__(self, last_marker_ledger_id: _Optional[int] = ..., last_marker_entry_id: _Optional[int] = ..., aborted_count: _Optional[int] = ...) -> None: ...

class TransactionBufferSnapshotRecord(_message.Message):
    __slots__ = ("max_read_ledger_id", "max_read_entry_id", "aborted", "coordinators", "taken_ms", "segments")
    MAX_READ_LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_READ_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    ABORTED_FIELD_NUMBER: _ClassVar[int]
    COORDINATORS_FIELD_NUMBER: _ClassVar[int]
    TAKEN_MS_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    max_read_ledger_id: int
    max_read_entry_id: int
    aborted: bytes
    coordinators: _containers.RepeatedCompositeFieldContainer[CoordinatorRecord]
    taken_ms: int
    segments: _containers.RepeatedCompositeFieldContainer[SnapshotSegmentRecord]
    def __init__(self, max_read_ledger_id: _Optional[int] = ..., max_read_entry_id: _Optional[int] = ..., aborted: _Optional[bytes] = ..., coordinators: _Optional[_Iterable[_Union[CoordinatorRecord, _Mapping]]] = ..., taken_ms: _Optional[int] = ..., segments: _Optional[_Iterable[_Union[SnapshotSegmentRecord, _Mapping]]] = ...) -> None: ...
