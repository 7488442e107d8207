"""Reconnect back-off."""

from pyengine.client.backoff import Backoff


def test_doubles_up_to_the_cap_with_jitter_and_resets():
    backoff = Backoff(0.1, 1.0)
    delays = [backoff.next() for _ in range(6)]
    for delay, nominal in zip(delays, [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]):
        assert nominal * 0.9 <= delay <= nominal
    backoff.reset()
    assert 0.09 <= backoff.next() <= 0.1
