"""`pyengine admin namespaces|topics set-retention` take pulsar-admin's options: `-t/--time`
with a time unit (a bare number: seconds, as pulsar-admin's "-t 120 sets retention to 2
minutes"), `-s/--size` with a size unit (a bare number: bytes), -1 for no limit; the policy
stored is in minutes and MB, as Pulsar's CLI converts it."""

from __future__ import annotations

import pytest

T = "persistent://public/default/r"
NS = "public/default"


async def test_set_retention_takes_pulsar_admins_units(admin, client):
    assert (await admin("namespaces", "set-retention", NS, "--time", "60m", "--size", "-1"))[0] == 0
    assert (await admin("namespaces", "get-retention", NS))[1] == {"retentionTimeInMinutes": 60,
                                                                  "retentionSizeInMB": -1}
    assert (await admin("namespaces", "set-retention", NS, "-t", "2h", "-s", "5M"))[0] == 0
    assert (await admin("namespaces", "get-retention", NS))[1] == {"retentionTimeInMinutes": 120,
                                                                  "retentionSizeInMB": 5}
    assert (await admin("namespaces", "set-retention", NS, "-t", "120", "-s", "1G"))[0] == 0   # seconds, bytes
    assert (await admin("namespaces", "get-retention", NS))[1] == {"retentionTimeInMinutes": 2,
                                                                  "retentionSizeInMB": 1024}
    producer = await client.create_producer(T)
    assert (await admin("topics", "set-retention", T, "-t", "1d", "-s", str(3 * 1024 * 1024)))[0] == 0
    assert (await admin("topics", "get-retention", T))[1] == {"retentionTimeInMinutes": 1440,
                                                             "retentionSizeInMB": 3}
    assert (await admin("topics", "set-retention", T, "--time", "-1", "--size", "-1"))[0] == 0
    assert (await admin("topics", "get-retention", T))[1] == {"retentionTimeInMinutes": -1,
                                                             "retentionSizeInMB": -1}
    await producer.close()


async def test_set_retention_refuses_what_pulsar_admin_refuses(admin):
    for time, size in (("-2", "-1"), ("1x", "-1"), ("10m", "3Q"), ("10m", "-5")):
        with pytest.raises(SystemExit):
            await admin("namespaces", "set-retention", NS, "--time", time, "--size", size)
    assert (await admin("namespaces", "get-retention", NS))[1] is None
