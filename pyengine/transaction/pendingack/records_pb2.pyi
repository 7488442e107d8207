from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AckKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INDIVIDUAL: _ClassVar[AckKind]
    CUMULATIVE: _ClassVar[AckKind]
INDIVIDUAL: AckKind
CUMULATIVE: AckKind

class AckSetRecord(_message.Message):
    __slots__ = ("words",)
    WORDS_FIELD_NUMBER: _ClassVar[int]
    words: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, words: _Optional[_Iterable[int]] = ...) -> None: ...

class PendingAckPositionRecord(_message.Message):
    __slots__ = ("ledger_id", "entry_id", "batch_size", "ack_set")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    ACK_SET_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    entry_id: int
    batch_size: int
    ack_set: AckSetRecord
    def __init__(self, ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., batch_size: _Optional[int] = ..., ack_set: _Optional[_Union[AckSetRecord, _Mapping]] = ...) -> None: ...

class PendingAckRecord(_message.Message):
    __slots__ = ("txn_most", "txn_least", "kind", "positions")
    TXN_MOST_FIELD_NUMBER: _ClassVar[int]
    TXN_LEAST_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    txn_most: int
    txn_least: int
    kind: AckKind
    positions: _containers.RepeatedCompositeFieldContainer[PendingAckPositionRecord]
    def __init__(self, txn_most: _Optional[int] = ..., txn_least: _Optional[int] = ..., kind: _Optional[_Union[AckKind, str]] = ..., positions: _Optional[_Iterable[_Union[PendingAckPositionRecord, _Mapping]]] = ...) -> None: ...
