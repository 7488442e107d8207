from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PositionRecord(_message.Message):
    __slots__ = ("ledger_id", "entry_id")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    entry_id: int
    def __init__(self, ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ...) -> None: ...

class TopicRecord(_message.Message):
    __slots__ = ("topic_id", "name", "created_ms", "terminated_at", "properties", "trimmed_through")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_AT_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    TRIMMED_THROUGH_FIELD_NUMBER: _ClassVar[int]
    topic_id: int
    name: str
    created_ms: int
    terminated_at: PositionRecord
    properties: _containers.ScalarMap[str, str]
    trimmed_through: PositionRecord
    def __init__(self, topic_id: _Optional[int] = ..., name: _Optional[str] = ..., created_ms: _Optional[int] = ..., terminated_at: _Optional[_Union[PositionRecord, _Mapping]] = ..., properties: _Optional[_Mapping[str, str]] = ..., trimmed_through: _Optional[_Union[PositionRecord, _Mapping]] = ...) -> None: ...

class LedgerRecord(_message.Message):
    __slots__ = ("ledger_id", "last_entry_id", "entries", "size", "created_ms", "closed", "closed_ms")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    CLOSED_MS_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    last_entry_id: int
    entries: int
    size: int
    created_ms: int
    closed: bool
    closed_ms: int
    def __init__(self, ledger_id: _Optional[int] = ..., last_entry_id: _Optional[int] = ..., entries: _Optional[int] = ..., size: _Optional[int] = ..., created_ms: _Optional[int] = ..., closed: _Optional[bool] = ..., closed_ms: _Optional[int] = ...) -> None: ...

class LedgerAcks(_message.Message):
    __slots__ = ("ledger_id", "entry_ids")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_IDS_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    entry_ids: bytes
    def __init__(self, ledger_id: _Optional[int] = ..., entry_ids: _Optional[bytes] = ...) -> None: ...

class BatchAcks(_message.Message):
    __slots__ = ("position", "ack_set")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    ACK_SET_FIELD_NUMBER: _ClassVar[int]
    position: PositionRecord
    ack_set: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, position: _Optional[_Union[PositionRecord, _Mapping]] = ..., ack_set: _Optional[_Iterable[int]] = ...) -> None: ...

class CursorRecord(_message.Message):
    __slots__ = ("name", "mark_delete", "individually_deleted", "batch_acks", "properties", "last_active_ms", "cursor_properties")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class CursorPropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    MARK_DELETE_FIELD_NUMBER: _ClassVar[int]
    INDIVIDUALLY_DELETED_FIELD_NUMBER: _ClassVar[int]
    BATCH_ACKS_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    LAST_ACTIVE_MS_FIELD_NUMBER: _ClassVar[int]
    CURSOR_PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    name: str
    mark_delete: PositionRecord
    individually_deleted: _containers.RepeatedCompositeFieldContainer[LedgerAcks]
    batch_acks: _containers.RepeatedCompositeFieldContainer[BatchAcks]
    properties: _containers.ScalarMap[str, int]
    last_active_ms: int
    cursor_properties: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., mark_delete: _Optional[_Union[PositionRecord, _Mapping]] = ..., individually_deleted: _Optional[_Iterable[_Union[LedgerAcks, _Mapping]]] = ..., batch_acks: _Optional[_Iterable[_Union[BatchAcks, _Mapping]]] = ..., properties: _Optional[_Mapping[str, int]] = ..., last_active_ms: _Optional[int] = ..., cursor_properties: _Optional[_Mapping[str, str]] = ...) -> None: ...
