"""Transaction-key epochs survive a SIGKILL of a real `pyengine serve` process: an epoch handed
out before the crash is never handed out again, and the open transaction of the key is aborted
by the first connect after the restart (not left to its timeout)."""

from __future__ import annotations

import pytest

from pyengine.client import Client
from pyengine.testing import ServeProcess

TOPIC = "persistent://public/default/keys-crash"


@pytest.fixture
def broker(tmp_path):
    process = ServeProcess(tmp_path / "data", "--num-coordinators", "4")
    process.start()
    try:
        yield process
    finally:
        process.kill()


async def test_epochs_never_go_backwards_after_kill_9(broker):
    for expected in range(3):
        async with Client(broker.url, operation_timeout_seconds=10, transaction_key="crash") as task:
            assert await task.connect_transaction_key() == expected
    hung = Client(broker.url, operation_timeout_seconds=10, transaction_key="crash")
    try:
        txn = await hung.new_transaction(timeout_ms=600_000)
        assert hung.transaction_epoch == 3
        producer = await hung.create_producer(TOPIC)
        await producer.send(b"from-the-crashed-task", txn=txn)
        plain = await hung.create_producer(TOPIC)
        await plain.send(b"queued-behind-it")
        broker.kill()                                  # SIGKILL: no clean shutdown
    finally:
        await hung.close()
    broker.start()
    async with Client(broker.url, operation_timeout_seconds=10) as reader_client:
        watcher = await reader_client.subscribe(TOPIC, "watch", initial_position="earliest")
        with pytest.raises(TimeoutError):
            await watcher.receive(timeout=0.3)          # the recovered open txn still holds it back
        async with Client(broker.url, operation_timeout_seconds=10, transaction_key="crash") as task:
            assert await task.connect_transaction_key() == 4
            assert (await watcher.receive(timeout=2)).data == b"queued-behind-it"
            with pytest.raises(TimeoutError):
                await watcher.receive(timeout=0.2)      # the crashed task's message never shows
    listed = broker.admin("GET", "/admin/v2/transactions/transaction-keys")
    assert [(k["key"], k["epoch"]) for k in listed] == [("crash", 4)]
