"""Helpers shared by the admin tests."""

from __future__ import annotations


async def drain(consumer, timeout: float = 0.2) -> list:
    """Everything the consumer can receive now (stops after `timeout` s of silence)."""
    out = []
    while True:
        try:
            out.append(await consumer.receive(timeout=timeout))
        except TimeoutError:
            return out
