"""Helpers shared by the broker tests."""


async def drain(consumer, timeout=0.2):
    """Everything the consumer can receive now (stops after `timeout` s of silence)."""
    out = []
    while True:
        try:
            out.append(await consumer.receive(timeout=timeout))
        except TimeoutError:
            return out
