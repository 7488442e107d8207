"""pyengine: a Pulsar-compatible transactional streaming engine with a native hot path."""

__version__ = "0.1.0"
