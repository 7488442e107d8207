"""The broker: topics, subscriptions, dispatch, and the embedding API (`Broker.embedded`)."""

from pyengine.broker.embedded import Broker, EmbeddedClient
from pyengine.broker.service import BrokerConfig, BrokerService

__all__ = ["Broker", "BrokerConfig", "BrokerService", "EmbeddedClient"]
