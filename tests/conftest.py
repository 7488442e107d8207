"""Suite-wide settings."""

from hypothesis import HealthCheck, settings

# Timing is not what these properties check, and the machines that run them are shared and
# noisy: no per-example deadline (a slow example is still reported by --durations).
settings.register_profile("pyengine", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("pyengine")
