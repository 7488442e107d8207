"""A subscription's properties (Pulsar's PIP-105): string keys to string values, given when a
durable subscription is created (CommandSubscribe.subscription_properties, the admin API's
create-subscription) and replaced as a whole by the admin API. They live in the cursor's
record, which every acknowledgement writes again: hence a bound on their size, which Pulsar
does not have (its cursor record is written to a ledger, not rewritten per ack).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyengine.errors import InvalidSubscriptionPropertiesError

# Keys and values together, UTF-8 encoded.
MAX_SUBSCRIPTION_PROPERTIES_BYTES = 64 * 1024


def check_subscription_properties(value: Any, what: str = "subscription_properties") -> dict[str, str]:
    """A copy of `value` (a mapping of str to str; None: none). TypeError for any other type;
    InvalidSubscriptionPropertiesError (a ValueError) for text that is not UTF-8 (a lone
    surrogate) or for more than MAX_SUBSCRIPTION_PROPERTIES_BYTES in all."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"{what} must be a mapping of str to str, not {type(value).__name__}")
    size = 0
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise TypeError(f"{what} must map str to str, not {type(key).__name__} to {type(item).__name__} "
                            f"({_shown(key)}: {_shown(item)})")
        try:
            size += len(key.encode()) + len(item.encode())
        except UnicodeEncodeError:
            raise InvalidSubscriptionPropertiesError(
                f"{what}: {_shown(key)}: {_shown(item)} is not UTF-8 text") from None
    if size > MAX_SUBSCRIPTION_PROPERTIES_BYTES:
        raise InvalidSubscriptionPropertiesError(
            f"{what}: {size} bytes of keys and values, more than {MAX_SUBSCRIPTION_PROPERTIES_BYTES}")
    return dict(value)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
