"""Topic properties (Pulsar 2.10's "properties on topics"): string pairs a user attaches to a
topic at its creation or later, kept with the topic and deleted with it.

As in Pulsar, a non-partitioned topic's (or one partition's) live in its managed ledger's
properties, and a partitioned topic's in its partitioned metadata (its partitions have their
own, empty unless set on them). Pulsar keeps the user's pairs and the broker's own ledger
properties (the topic epoch of producer access modes, the transaction design) in the same map,
so a user could read and overwrite the broker's. Here a user's key K is stored in the ledger as
`user:K`: the broker's properties are never shown nor changed through the admin API, and a
user may choose any key, the broker's own names included.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyengine.storage import ManagedLedger
from pyengine.storage.managed_ledger import is_utf8

USER_PROPERTY_PREFIX = "user:"


def check_properties(properties: Any, *, deletions: bool = False) -> dict[str, str | None]:
    """`properties` as a dict of text keys and values (None for a key to delete, where
    `deletions`); ValueError for anything else, before anything is changed."""
    if not isinstance(properties, Mapping):
        raise ValueError(f"topic properties are an object of string values, not {type(properties).__name__}")
    checked: dict[str, str | None] = {}
    for key, value in properties.items():
        if not isinstance(key, str) or not key:
            raise ValueError("a topic property's key must be a non-empty string")
        if not (isinstance(value, str) or value is None and deletions):
            raise ValueError(f"topic property {key[:60]!r}: its value must be a string, not {type(value).__name__}")
        for text in (key, value):
            if text is not None and not is_utf8(text):
                raise ValueError(f"topic property {key[:60]!r}: not UTF-8 text (a lone surrogate)")
        checked[key] = value
    return checked


def ledger_topic_properties(ledger: ManagedLedger) -> dict[str, str]:
    """The user's properties of a non-partitioned topic (or partition), without the broker's."""
    start = len(USER_PROPERTY_PREFIX)
    return {key[start:]: value for key, value in ledger.properties.items() if key.startswith(USER_PROPERTY_PREFIX)}


async def update_ledger_topic_properties(ledger: ManagedLedger, changes: Mapping[str, str | None]) -> None:
    """Set (None: delete) user properties of a non-partitioned topic, all in one save."""
    checked = check_properties(changes, deletions=True)
    await ledger.update_properties({USER_PROPERTY_PREFIX + key: value for key, value in checked.items()})
