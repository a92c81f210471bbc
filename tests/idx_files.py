"""MNIST IDX files written for the tests, as gpuflow.ssvae.data.read_idx reads them."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np


def write_idx(path: str | Path, array: np.ndarray) -> None:
    """Write a uint8 array as an IDX file (gzipped when the name ends in .gz)."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    shape = b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    opener = gzip.open if Path(path).suffix == ".gz" else open
    with opener(path, "wb") as handle:
        handle.write(bytes([0, 0, 0x08, array.ndim]) + shape + array.tobytes())
