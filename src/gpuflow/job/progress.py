"""How far a running step is: the one progress file format `gpuflow status` reads."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gpuflow.job.atomic import write_json
from gpuflow.job.paths import PROGRESS, job_file
from gpuflow.job.record import read_record

EVERY_S = 2.0
KEYS = ("done", "total", "unit", "started", "updated", "resumed_at")


def progress_path(first_output: str | Path) -> Path:
    """The progress file of the job whose first output is `first_output`."""
    return job_file(first_output, PROGRESS)


def write_progress(
    path: str | Path,
    done: float,
    total: float,
    unit: str,
    started: float | None = None,
    resumed_at: float = 0,
) -> None:
    """Write the progress file atomically (`started` defaults to now)."""
    now = time.time()
    record = {
        "done": done,
        "total": total,
        "unit": unit,
        "started": now if started is None else started,
        "updated": now,
        "resumed_at": resumed_at,
    }
    write_json(path, record)


def read_progress(path: str | Path) -> dict[str, Any] | None:
    """The progress record at `path`, or None when there is none or it is not one."""
    record = read_record(path)  # any JSON object file, or None
    return record if record is not None and set(KEYS) <= record.keys() else None


class ProgressWriter:
    """Writes one job's progress at most every EVERY_S seconds (and always the first time)."""

    def __init__(self, path: Path | None, total: float, unit: str, resumed_at: float = 0):
        self.path, self.total, self.unit = path, total, unit
        self.resumed_at = resumed_at
        self.started = time.time()
        self._last = -float("inf")

    def update(self, done: float, force: bool = False) -> None:
        """Record `done` of `total`, unless the file was written less than EVERY_S ago."""
        if self.path is None:
            return
        if force or time.monotonic() - self._last >= EVERY_S:
            write_progress(self.path, done, self.total, self.unit, self.started, self.resumed_at)
            self._last = time.monotonic()
