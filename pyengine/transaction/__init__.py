"""Transactions: the vocabulary shared by the coordinator, the transaction buffers and the
pending-ack handles, for both designs — v4 (PIP-31: coordinator log, markers in the stream,
pending-ack log) and v5 (PIP-473: state in the metadata store)."""

from __future__ import annotations

from enum import IntEnum


class TxnStatus(IntEnum):
    """Coordinator-side state of a transaction (the values of Pulsar's TxnStatus, plus TIME_OUT)."""

    OPEN = 0
    COMMITTING = 1        # decided: commit; participants are being told
    COMMITTED = 2
    ABORTING = 3          # decided: abort; participants are being told
    ABORTED = 4
    TIME_OUT = 6          # aborted by the coordinator because its timeout expired (terminal)

    @property
    def is_terminal(self) -> bool:
        return self in (TxnStatus.COMMITTED, TxnStatus.ABORTED, TxnStatus.TIME_OUT)

    @property
    def outcome(self) -> TxnAction | None:
        """The decision taken, once there is one."""
        if self in (TxnStatus.COMMITTING, TxnStatus.COMMITTED):
            return TxnAction.COMMIT
        if self in (TxnStatus.ABORTING, TxnStatus.ABORTED, TxnStatus.TIME_OUT):
            return TxnAction.ABORT
        return None


class TxnAction(IntEnum):
    """What END_TXN asks for (the wire's TxnAction values)."""

    COMMIT = 0
    ABORT = 1
