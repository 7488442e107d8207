"""Stored entries to columns (compiled): the Spark data source's decoder, one row per message."""

from collections.abc import Iterable, Sequence
from typing import Any, SupportsIndex

import numpy as np
import numpy.typing as npt
from typing_extensions import Buffer

class RecordFormatError(ValueError): ...
class ChunkTooLargeError(RecordFormatError): ...

def decompress(codec: int, payload: bytes, uncompressed_size: int) -> bytes: ...

def entry_headers(
    values: Iterable[Buffer],
) -> tuple[
    npt.NDArray[np.int32], npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int32], npt.NDArray[np.int64]
]: ...
def decode_entries(
    ledger_ids: Sequence[SupportsIndex] | npt.NDArray[np.int64],
    entry_ids: Sequence[SupportsIndex] | npt.NDArray[np.int64],
    values: Iterable[Buffer],
    keep: npt.NDArray[np.bool_] | Sequence[bool] | None = None,
) -> dict[str, Any]: ...
def chunk_indices(
    ledger_ids: Sequence[SupportsIndex] | npt.NDArray[np.int64],
    entry_ids: Sequence[SupportsIndex] | npt.NDArray[np.int64],
    values: Iterable[Buffer],
    keep: npt.NDArray[np.bool_] | Sequence[bool] | None = None,
) -> npt.NDArray[np.int64]: ...
