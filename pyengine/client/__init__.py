"""Client-side API: messages and message ids (shared by the embedded and network clients)."""

from pyengine.client.message import Message, MessageId

__all__ = ["Message", "MessageId"]
