"""Expire by message id with an id beyond the topic's last entry: 409 and nothing expired, but
the request is recorded as the subscription's last expiry (stats' lastExpireTimestamp), as
Pulsar's PersistentSubscription.expireMessages(Position) sets it before finding the position
invalid."""

from __future__ import annotations

from tests.admin.test_expire_by_message_id import P, message_id, published, subscribed_at_earliest


async def test_an_id_beyond_the_last_entry_still_records_the_expiry(api, client):
    ids = await published(client, "beyond", 2)
    await subscribed_at_earliest(api, "beyond")
    stats = (await api.get(f"{P}/beyond/stats")).body["subscriptions"]["s"]
    assert stats["lastExpireTimestamp"] == 0
    reply = await api.post(f"{P}/beyond/subscription/s/expireMessages", message_id(ids[1], entryId=ids[1].entry_id + 1))
    assert reply.status == 409
    stats = (await api.get(f"{P}/beyond/stats")).body["subscriptions"]["s"]
    assert stats["lastExpireTimestamp"] > 0
    assert (stats["msgBacklog"], stats["totalMsgExpired"]) == (2, 0)          # nothing expired
