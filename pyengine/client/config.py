"""Client-wide settings, checked once when the client is built."""

from __future__ import annotations

from dataclasses import dataclass

from pyengine.client.validation import check_positive_number


@dataclass(frozen=True, slots=True)
class ClientConfig:
    operation_timeout: float = 30.0          # seconds, every request and each create/subscribe retry loop
    connection_timeout: float = 10.0         # seconds, TCP connect plus the CONNECT/CONNECTED handshake
    keep_alive_interval: float = 30.0        # seconds between PINGs; silence for two intervals closes
    initial_backoff: float = 0.1             # seconds before the first reconnect attempt
    max_backoff: float = 30.0                # cap of the doubling back-off

    def __post_init__(self) -> None:
        for name in ("operation_timeout", "connection_timeout", "keep_alive_interval", "initial_backoff",
                     "max_backoff"):
            check_positive_number(name, getattr(self, name))
