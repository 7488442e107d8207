"""A consumer attached over the network: the `ConsumerSink` that turns deliveries into
MESSAGE frames on its connection.

Each MESSAGE is written as two buffers, the frame head (sizes and command) and the stored entry
itself (checksum, metadata and payload exactly as the producer sent them), so payload bytes are
never copied in Python on their way out.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from pyengine.broker.consumer import NO_CONSUMER_EPOCH, Consumer, Delivery
from pyengine.broker.dispatcher import SINGLE_ACTIVE_TYPES
from pyengine.broker.subscription import Subscription
from pyengine.broker.topic import Topic
from pyengine.protocol import replies

if TYPE_CHECKING:
    from pyengine.protocol.connection import ServerConnection


class NetworkConsumer:
    """One client consumer id on one connection (implements `ConsumerSink`)."""

    def __init__(self, connection: ServerConnection, consumer_id: int, topic: Topic,
                 subscription_name: str, sub_type: str, durable: bool) -> None:
        self.connection = connection
        self.consumer_id = consumer_id
        self.topic = topic
        self.subscription_name = subscription_name     # the client's name (a reader's too)
        self.sub_type = sub_type
        self.durable = durable
        self.subscription: Subscription | None = None
        self.broker_consumer: Consumer | None = None
        self.closed = False

    def attach(self, subscription: Subscription, broker_consumer: Consumer) -> None:
        self.subscription = subscription
        self.broker_consumer = broker_consumer

    # --- ConsumerSink ---------------------------------------------------------------------

    def deliver(self, deliveries: list[Delivery]) -> None:
        if self.closed:
            return
        head = replies.message_head
        epoch = self._stamped_epoch()
        if epoch != NO_CONSUMER_EPOCH:
            head = functools.partial(head, consumer_epoch=epoch)
        consumer_id = self.consumer_id
        partition = self.topic.partition_index
        buffers: list[bytes] = []
        for delivery in deliveries:
            entry = delivery.entry
            data = entry.data
            buffers.append(head(consumer_id, entry.position, delivery.redelivery_count, delivery.ack_set, len(data),
                                partition))
            buffers.append(data)
        self.connection.write_many(buffers)

    def _stamped_epoch(self) -> int:
        """The PIP-84 epoch to put on MESSAGEs now (NO_CONSUMER_EPOCH: none): only Exclusive and
        Failover messages carry it, as Pulsar's single-active dispatcher sends them (its others
        send none), and only when the client gave one."""
        consumer = self.broker_consumer
        if consumer is None or self.sub_type not in SINGLE_ACTIVE_TYPES:
            return NO_CONSUMER_EPOCH
        return consumer.consumer_epoch

    def active_changed(self, active: bool) -> None:
        # Apache notifies Failover consumers only; the client uses it for its listener.
        if not self.closed and self.sub_type == "failover":
            self.connection.write(replies.active_consumer_change(self.consumer_id, active))

    def reset(self) -> None:
        """The subscription was moved (seek, reset cursor): like Apache, disconnect the
        consumer so that the client subscribes again and refills its queue with permits."""
        if not self.closed:
            self.connection.disconnect_consumer(self, keep_reader=True)

    def closed_by_broker(self) -> None:
        if not self.closed:
            self.connection.disconnect_consumer(self, keep_reader=False, detached=True)

    # --- state for stats ------------------------------------------------------------------

    def stats(self) -> dict:
        consumer = self.broker_consumer
        subscription = self.subscription
        return {
            "consumerName": consumer.name if consumer else "",
            "availablePermits": consumer.permits if consumer else 0,
            # As Pulsar: counted on Shared and Key_Shared only (individual-ack mode).
            "unackedMessages": (consumer.unacked_messages if consumer and self.sub_type in ("shared", "key_shared")
                                else 0),
            "blockedConsumerOnUnackedMsgs": consumer.blocked_on_unacked if consumer else False,
            "msgBacklog": subscription.backlog() if subscription else 0,
            "type": {"exclusive": "Exclusive", "shared": "Shared", "failover": "Failover",
                     "key_shared": "Key_Shared"}[self.sub_type],
            "address": self.connection.peer,
        }
