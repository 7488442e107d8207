from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LoggedTxnStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OPEN: _ClassVar[LoggedTxnStatus]
    COMMITTING: _ClassVar[LoggedTxnStatus]
    COMMITTED: _ClassVar[LoggedTxnStatus]
    ABORTING: _ClassVar[LoggedTxnStatus]
    ABORTED: _ClassVar[LoggedTxnStatus]
    TIME_OUT: _ClassVar[LoggedTxnStatus]

class TxnLogOp(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NEW: _ClassVar[TxnLogOp]
    ADD_PARTITION: _ClassVar[TxnLogOp]
    ADD_SUBSCRIPTION: _ClassVar[TxnLogOp]
    UPDATE: _ClassVar[TxnLogOp]
    FINISHED: _ClassVar[TxnLogOp]
OPEN: LoggedTxnStatus
COMMITTING: LoggedTxnStatus
COMMITTED: LoggedTxnStatus
ABORTING: LoggedTxnStatus
ABORTED: LoggedTxnStatus
TIME_OUT: LoggedTxnStatus
NEW: TxnLogOp
ADD_PARTITION: TxnLogOp
ADD_SUBSCRIPTION: TxnLogOp
UPDATE: TxnLogOp
FINISHED: TxnLogOp

class LoggedSubscription(_message.Message):
    __slots__ = ("topic", "subscription")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ...) -> None: ...

class TxnLogRecord(_message.Message):
    __slots__ = ("op", "txn_most", "txn_least", "timeout_ms", "start_ms", "partitions", "subscriptions", "expected_status", "new_status", "modified_ms", "timed_out")
    OP_FIELD_NUMBER: _ClassVar[int]
    TXN_MOST_FIELD_NUMBER: _ClassVar[int]
    TXN_LEAST_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_STATUS_FIELD_NUMBER: _ClassVar[int]
    NEW_STATUS_FIELD_NUMBER: _ClassVar[int]
    MODIFIED_MS_FIELD_NUMBER: _ClassVar[int]
    TIMED_OUT_FIELD_NUMBER: _ClassVar[int]
    op: TxnLogOp
    txn_most: int
    txn_least: int
    timeout_ms: int
    start_ms: int
    partitions: _containers.RepeatedScalarFieldContainer[str]
    subscriptions: _containers.RepeatedCompositeFieldContainer[LoggedSubscription]
    expected_status: LoggedTxnStatus
    new_status: LoggedTxnStatus
    modified_ms: int
    timed_out: bool
    def __init__(self, op: _Optional[_Union[TxnLogOp, str]] = ..., txn_most: _Optional[int] = ..., txn_least: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., start_ms: _Optional[int] = ..., partitions: _Optional[_Iterable[str]] = ..., subscriptions: _Optional[_Iterable[_Union[LoggedSubscription, _Mapping]]] = ..., expected_status: _Optional[_Union[LoggedTxnStatus, str]] = ..., new_status: _Optional[_Union[LoggedTxnStatus, str]] = ..., modified_ms: _Optional[int] = ..., timed_out: _Optional[bool] = ...) -> None: ...

class CoordinatorHeader(_message.Message):
    __slots__ = ("next_txn_sequence",)
    NEXT_TXN_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    next_txn_sequence: int
    def __init__(self, next_txn_sequence: _Optional[int] = ...) -> None: ...
