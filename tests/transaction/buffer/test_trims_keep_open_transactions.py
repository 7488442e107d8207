"""Retention never trims an open transaction's entries (nor what follows them): the ledgers
holding entries after the read horizon stay. Found by an audit: a trim with retention 0 deleted
an open transaction's first entries; the snapshot the trim wrote keeps no open transactions, so
the Spark source and a restarted broker forgot it and showed the messages behind it
(READ_COMMITTED violated), and its commit would have left it torn."""

from __future__ import annotations

from pyengine.broker import Broker
from pyengine.broker.policies import Retention
from pyengine.storage import ManagedLedgerConfig
from pyengine.transaction import TxnAction
from tests.broker.helpers import drain

T = "persistent://public/default/open-and-trimmed"
CONFIG = dict(sync=False, retention=Retention(0, 0), ledger=ManagedLedgerConfig(max_entries_per_ledger=3))


async def test_an_open_transaction_outlives_a_trim_and_a_restart(tmp_path):
    async with Broker.embedded(tmp_path, **CONFIG) as broker:
        producer = await broker.create_producer(T)
        await producer.send(b"before")
        txn = await broker.new_transaction(timeout_ms=3_600_000)
        await producer.send(b"open-1", txn=txn)
        for i in range(6):
            await producer.send(b"plain-%d" % i)           # rolls ledgers past the txn's first
        await producer.send(b"open-2", txn=txn)
        ledger = broker.service.topics[T].ledger
        first_of_txn = broker.service.topics[T].buffer.ongoing_txns()[0][1]
        trimmed = await ledger.trim(now_ms=10**13)
        assert all(ledger_id < first_of_txn.ledger_id for ledger_id in trimmed)
        assert ledger.first_position() <= first_of_txn
        txn_id = txn.txn_id
    async with Broker.embedded(tmp_path, **CONFIG) as broker:
        buffer = (await broker.service.get_topic(T)).buffer
        assert [txn for txn, _ in buffer.ongoing_txns()] == [txn_id]          # not forgotten
        consumer = await broker.subscribe(T, "s", initial_position="earliest")
        assert [m.data for m in await drain(consumer)] == [b"before"]    # the rest is held back
        await broker.service.coordinator.end_transaction(txn_id, TxnAction.COMMIT)
        assert [m.data for m in await drain(consumer)] == [       # the whole transaction, in order
            b"open-1", *(b"plain-%d" % i for i in range(6)), b"open-2"]
