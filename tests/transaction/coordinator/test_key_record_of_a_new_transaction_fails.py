"""NEW_TXN under a transaction key writes the key's record (its transaction, bound to the epoch)
after the coordinator created the transaction. When that record cannot be written (a full map,
a failing disk) the request fails and the client never learns the transaction's id: the key
must stay as it is stored. It used to keep the transaction bound in memory, so the key's next
NEW_TXN was refused ("already has an open transaction") until that orphan timed out, while a
restart knew nothing of it."""

from __future__ import annotations

import pytest

from pyengine.storage import StorageError
from pyengine.transaction import TxnAction, TxnStatus
from pyengine.transaction.coordinator.keys import ANONYMOUS, coordinator_for
from tests.storage.helpers import fail_next_save
from tests.transaction.coordinator.test_keys import N, harness  # noqa: F401  (the keys tests' fixture)

KEY = "k"


def fail_next_key_record(env) -> list:
    """The next group commit that writes a txnkey record fails as a whole."""
    return fail_next_save(env, "txnkey")


async def test_a_new_transaction_whose_key_record_failed_leaves_the_key_as_stored(harness):
    service = harness.service
    keys, coordinator = service.keys, coordinator_for(ANONYMOUS, KEY, N)
    epoch = await keys.connect(ANONYMOUS, KEY, coordinator, -1)
    first = await keys.new_transaction(ANONYMOUS, KEY, epoch, coordinator, 60_000)
    assert await service.end_transaction(first, TxnAction.COMMIT) is TxnStatus.COMMITTED
    assert fail_next_key_record(harness.env) == []
    with pytest.raises(StorageError, match="injected"):
        await keys.new_transaction(ANONYMOUS, KEY, epoch, coordinator, 60_000)
    # The client's retry gets a transaction of the key (it was refused: the key's open one
    # was the transaction the client never got), and a restart agrees.
    second = await keys.new_transaction(ANONYMOUS, KEY, epoch, coordinator, 60_000)
    assert keys.find(ANONYMOUS, KEY).history[-1][0] == first
    service = await harness.restart()
    assert service.keys.find(ANONYMOUS, KEY).txn == second
    assert service.get(second).status is TxnStatus.OPEN
    service.keys.check_txn(second)
