"""Argument checks of the coordinator's public methods: wrong types are TypeErrors (a caller's
bug), wrong values that can come from a client are the Pulsar errors the wire reports."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyengine.errors import InvalidSubscriptionNameError, InvalidTopicNameError
from pyengine.transaction import TxnAction, TxnStatus
from pyengine_kernels import TxnId


def check_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    return value


def check_txn(txn: Any) -> TxnId:
    if not isinstance(txn, TxnId):
        raise TypeError(f"txn must be a TxnId, not {type(txn).__name__}")
    return txn


def check_action(action: Any) -> TxnAction:
    if isinstance(action, bool) or not isinstance(action, int):
        raise TypeError(f"action must be a TxnAction, not {type(action).__name__}")
    try:
        return TxnAction(action)
    except ValueError:
        raise ValueError(f"unknown transaction action {action!r} (COMMIT=0, ABORT=1)") from None


def check_status(status: Any, name: str) -> TxnStatus:
    if isinstance(status, bool) or not isinstance(status, int):
        raise TypeError(f"{name} must be a TxnStatus, not {type(status).__name__}")
    try:
        return TxnStatus(status)
    except ValueError:
        raise ValueError(f"{name}: unknown transaction status {status!r}") from None


def check_partitions(partitions: Any) -> list[str]:
    if isinstance(partitions, str | bytes) or not isinstance(partitions, Sequence):
        raise TypeError(f"partitions must be a list of topic names, not {type(partitions).__name__}")
    for topic in partitions:
        _check_name(topic, "topic")
    return list(partitions)


def check_subscriptions(subscriptions: Any) -> list[tuple[str, str]]:
    if isinstance(subscriptions, str | bytes) or not isinstance(subscriptions, Sequence):
        raise TypeError("subscriptions must be a list of (topic, subscription) pairs, "
                        f"not {type(subscriptions).__name__}")
    checked = []
    for item in subscriptions:
        if isinstance(item, str | bytes) or not isinstance(item, Sequence) or len(item) != 2:
            raise TypeError(f"each subscription must be a (topic, subscription) pair, not {item!r}")
        checked.append((_check_name(item[0], "topic"), _check_name(item[1], "subscription")))
    return checked


def _check_name(name: Any, what: str) -> str:
    if not isinstance(name, str):
        raise TypeError(f"{what} name must be a str, not {type(name).__name__}")
    if not name:
        raise (InvalidTopicNameError if what == "topic" else InvalidSubscriptionNameError)(f"{what} name must not be empty")
    return name
