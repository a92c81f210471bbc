"""A run's measured job times: its `benchmark:` files, and what its job records add to them."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any


def benchmark_seconds(path: Path) -> float | None:
    """Mean wall time (column s) of a benchmark TSV; None when it holds none."""
    try:
        with open(path, newline="") as handle:
            values = [float(row["s"]) for row in csv.DictReader(handle, delimiter="\t")]
    except (OSError, KeyError, ValueError):
        return None
    return sum(values) / len(values) if values else None


def earlier_attempts_s(record: dict[str, Any]) -> float:
    """Seconds a finished job's earlier attempts spent on the work it resumed (0: one attempt)."""
    timings = record.get("timings") if record.get("status") == "finished" else None
    seconds = timings.get("earlier_attempts_s", 0.0) if isinstance(timings, dict) else 0.0
    return float(seconds) if isinstance(seconds, int | float) else 0.0
