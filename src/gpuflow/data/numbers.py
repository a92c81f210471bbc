"""Numeric columns of a CSV read by pandas, checked value by value."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from gpuflow.errors import DataError


def finite_column(
    path: str | Path, frame: pd.DataFrame, column: str, positive: bool = False
) -> pd.Series:
    """`frame[column]` as floats; a non-finite (or, `positive`, non-positive) value: DataError."""
    values = pd.to_numeric(frame[column], errors="coerce").astype(float)
    array = values.to_numpy(dtype=float, na_value=np.nan)
    bad = ~np.isfinite(array)
    if positive:
        bad |= array <= 0
    if bad.any():
        position = int(np.flatnonzero(bad)[0])
        value = frame[column].iloc[position]
        kind = "positive finite number" if positive else "finite number"
        raise DataError(
            path,
            f"{column} {value.item() if hasattr(value, 'item') else value!r} is not a {kind}",
            row=position + 2,
        )
    return values
