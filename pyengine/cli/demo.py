"""`pyengine demo`: the native kernels at work on a synthetic transactional topic.

Shows what the engine's read path does per entry: track ongoing transactions to get the read
horizon, remember aborted transactions, and keep only what a READ_COMMITTED consumer may see.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from core_ext.frames import FrameDecoder, encode_payload_frame
from pyengine.cli.argtypes import whole_number
from pyengine_kernels import AbortedTxnSet, OngoingTxnMap, Position, TxnId, visibility_mask


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the native kernels on a synthetic transactional topic")
    p.add_argument("--rows", type=whole_number(10), default=2_000_000, help="entries in the synthetic topic")
    p.add_argument("--seed", type=whole_number(0), default=1)


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except MemoryError:
        raise SystemExit(f"pyengine demo: not enough memory for --rows {args.rows:,}") from None


def _run(args: argparse.Namespace) -> int:
    rng = np.random.default_rng(args.seed)
    n = args.rows
    idx = np.arange(n, dtype=np.int64)
    ledger, entry = idx // 100_000, idx % 100_000
    block = idx // 10
    in_txn = (rng.random(n // 10 + 1) < 0.5)[block]
    most, least = np.where(in_txn, block % 4, -1), np.where(in_txn, block, -1)
    is_marker = in_txn & (idx % 10 == 9)

    # Replay the topic the way a transaction buffer does: the first entry of a txn makes it
    # ongoing; its marker ends it (committed, or aborted one time in five).
    started = time.perf_counter()
    ongoing, aborted = OngoingTxnMap(), AbortedTxnSet()
    txn_rows = np.flatnonzero(in_txn & (idx % 10 == 0))
    for row in txn_rows.tolist():
        txn = TxnId(int(most[row]), int(least[row]))
        ongoing.add(txn, Position(int(ledger[row]), int(entry[row])))
        if row + 9 < n and (row // 10) % 7 != 0:        # every 7th txn is still open at the end
            ongoing.remove(txn)
            if rng.random() < 0.2:
                aborted.add(txn, Position(int(ledger[row + 9]), int(entry[row + 9])))
    lac = Position(int(ledger[-1]), int(entry[-1]))
    horizon = ongoing.max_read_position(lac)
    replay_s = time.perf_counter() - started

    started = time.perf_counter()
    mask = visibility_mask(ledger, entry, most, least, is_marker, horizon, aborted)
    filter_s = time.perf_counter() - started

    frame = encode_payload_frame(b"\x08\x06", b"\x0a\x04demo", b"x" * 1024)
    decoded = FrameDecoder().feed(frame * 1000)

    print(f"topic: {n:,} entries, {txn_rows.size:,} transactions "
          f"({len(aborted):,} aborted, {len(ongoing):,} still open)")
    print(f"replayed txn state in {replay_s * 1e3:.1f} ms; last add confirmed {lac}, read horizon {horizon}")
    print(f"READ_COMMITTED filter: {int(mask.sum()):,} of {n:,} entries visible, "
          f"{filter_s * 1e3:.1f} ms ({n / filter_s / 1e6:.0f} M rows/s)")
    print(f"frame codec: 1000 payload frames of 1 KiB split and checksummed -> {len(decoded)} frames")
    return 0
