"""Helpers of the storage tests."""

import asyncio

from pyengine.storage import ManagedLedger, StorageEnvironment


async def settled(ml: ManagedLedger) -> None:
    """Let a background trim finish."""
    for _ in range(100):
        await asyncio.sleep(0)
        if ml._trimming is None:
            return
        await asyncio.wait([ml._trimming])


def fail_next_save(env: StorageEnvironment, kind: str | None = None, failed: list | None = None) -> list:
    """The next group commit that writes a record submitted under a key `(kind, ...)` (a
    "cursor", a "topic" record, a "txnkey" record; None: any write) fails as a whole. The
    list (`failed`, or a new one): the key that failed, once it has."""
    real_submit, failed = env.submit, [] if failed is None else failed

    def submit(write, *, key=None, **kwargs):
        if not failed and (kind is None or isinstance(key, tuple) and key[0] == kind):
            failed.append(key)

            def write(txn):
                raise RuntimeError("injected: the disk is failing")
        return real_submit(write, key=key, **kwargs)

    env.submit = submit
    return failed


def fail_next_save_after_close(owner, env: StorageEnvironment) -> list:
    """The first group commit after `owner.close()` (a topic's or a subscription's: the write
    of its deletion) fails as a whole; the list: its key, once it has."""
    close, failed = owner.close, []

    async def close_then_fail_the_next_commit():
        await close()
        fail_next_save(env, failed=failed)
    owner.close = close_then_fail_the_next_commit
    return failed
