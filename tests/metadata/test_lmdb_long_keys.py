"""The LMDB store's key space holds keys of any length, in the same order as the memory store's.

LMDB refuses keys over 511 bytes; record paths have no length limit, index entries hold keys of
up to 4096 bytes plus a path, and long topic and subscription names (percent-encoded in paths)
reach that in normal use. Found by an audit: such a write failed half-way on LMDB — and the half
was committed. Keys of up to 508 bytes (511 less the `ms:` prefix) stay plain LMDB keys, as in
every earlier data dir; longer ones live in slots (see `lmdb_store`). These tests compare the
LMDB key space with the memory store's (`MemoryKV`), around every length where the encoding
changes."""

from __future__ import annotations

import random

import pytest

from pyengine.metadata import MetadataStoreError
from pyengine.metadata.lmdb_store import HEAD_BYTES, KEY_PREFIX, MAX_KEY_BYTES, LmdbKV, _slot_key
from pyengine.metadata.local import MemoryKV
from pyengine.storage import StorageEnvironment


@pytest.fixture
def env(tmp_path):
    env = StorageEnvironment(tmp_path / "data", sync=False)
    yield env
    env.close()


def write(env, fn):
    return env.write_now(lambda txn: fn(LmdbKV(txn, env.db("metadata"))))


def read(env, fn):
    with env.read() as txn:
        return fn(LmdbKV(txn, env.db("metadata")))


LENGTHS = [1, 5, HEAD_BYTES - 1, HEAD_BYTES, HEAD_BYTES + 1, HEAD_BYTES + 20, MAX_KEY_BYTES - 1,
           MAX_KEY_BYTES, MAX_KEY_BYTES + 1, MAX_KEY_BYTES + 2, 600, 1500]


def random_key(rng: random.Random, heads: list[bytes]) -> bytes:
    """Keys that share long heads (so that plain keys and slots of one head mix), of the
    lengths where the encoding changes, with bytes that sort around the digests' (0x00, 0xff)."""
    length = rng.choice(LENGTHS)
    base = rng.choice(heads)
    cut = rng.randint(max(0, min(len(base), length) - 40), min(len(base), length))
    tail = bytes(rng.choice(b"\x00\x01ab\x7f\xfe\xff") for _ in range(length - cut))
    return base[:cut] + tail


def test_the_lmdb_key_space_is_the_memory_one_for_keys_of_any_length(env):
    rng = random.Random(4711)
    heads = [b"r/" + b"h" * 1600, b"r/" + b"h" * 470 + b"\xff" * 1000, b"i" + bytes(range(256)) * 6, b"x" * 1600]
    model = MemoryKV()
    keys: list[bytes] = []
    for _round in range(12):
        ops = []
        for _ in range(150):
            if keys and rng.random() < 0.25:
                ops.append(("delete", rng.choice(keys), b""))
            else:
                key = random_key(rng, heads)
                keys.append(key)
                ops.append(("put", key, rng.randbytes(rng.choice([0, 3, 40]))))

        def apply(kv, ops=ops):
            for op, key, value in ops:
                kv.put(key, value) if op == "put" else kv.delete(key)
        apply(model)
        write(env, apply)
        for key in keys:
            assert read(env, lambda kv: kv.get(key)) == model.get(key), (len(key), key[:8])
        assert read(env, lambda kv: list(kv.scan(b"", None))) == list(model.scan(b"", None))
        bounds = keys + [k[:cut] for k in rng.sample(keys, 20) for cut in (HEAD_BYTES, MAX_KEY_BYTES, 3)]
        bounds += [k + b"\x00" for k in rng.sample(keys, 10)]
        for _ in range(60):
            start = rng.choice(bounds)
            end = rng.choice(bounds + [None])
            got = read(env, lambda kv: list(kv.scan(start, end)))
            assert got == list(model.scan(start, end)), (len(start), None if end is None else len(end))
            # a scan stopped early (as read_children and paged reads do) gets a prefix of it
            partial = read(env, lambda kv: [entry for entry, _ in zip(kv.scan(start, end), range(3))])
            assert partial == got[:3]


def test_keys_up_to_508_bytes_stay_plain_lmdb_keys_and_longer_ones_go_to_slots(env):
    db = env.db("metadata")
    plain = b"r/" + b"a" * (MAX_KEY_BYTES - 2)
    long = b"r/" + b"a" * 1000

    def fill(kv):
        kv.put(plain, b"plain")
        kv.put(long, b"long")
    write(env, fill)
    with env.read() as txn:
        assert txn.get(KEY_PREFIX + plain, db=db) == b"plain"      # as an earlier data dir has it
        assert txn.get(_slot_key(long), db=db).endswith(b"long")
        assert all(len(key) <= env._env.max_key_size() for key, _ in txn.cursor(db=db))
    assert read(env, lambda kv: (kv.get(plain), kv.get(long))) == (b"plain", b"long")


def test_a_plain_508_byte_key_with_any_value_is_not_taken_for_a_slot(env):
    db = env.db("metadata")
    long = b"r/" + b"z" * 900
    impostor = _slot_key(long)[len(KEY_PREFIX):]       # a plain key equal to the slot's LMDB key
    assert len(impostor) == MAX_KEY_BYTES
    write(env, lambda kv: kv.put(impostor, b"\x00\x00\x01\xa6" + b"junk"))
    assert read(env, lambda kv: (kv.get(impostor), kv.get(long))) == (b"\x00\x00\x01\xa6junk", None)
    assert read(env, lambda kv: list(kv.scan(b"r/", None))) == [(impostor, b"\x00\x00\x01\xa6junk")]
    # ... and the long key, whose slot is taken, is refused rather than overwriting it
    with pytest.raises(MetadataStoreError, match="collides"):
        write(env, lambda kv: kv.put(long, b"v"))
    with env.read() as txn:
        assert txn.get(KEY_PREFIX + impostor, db=db) == b"\x00\x00\x01\xa6junk"
