"""How far a running step is: a small JSON file beside its output, for `gpuflow status`.

`<output>.progress.json` holds {"done", "total", "unit", "updated", "started"} (times in unix
seconds). It is written atomically, at most every few seconds while the step works, and removed
with the step's resume state once the output is written.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from gpuflow.job.atomic import write_json

EVERY_S = 2.0


def progress_path(output: str | Path) -> Path:
    """The progress file of `output`: `<output>.progress.json`."""
    output = Path(output)
    return output.with_name(f"{output.name}.progress.json")


def write_progress(
    path: str | Path, done: int, total: int, unit: str, started: float | None = None
) -> None:
    """Write the progress file atomically (`started` defaults to now)."""
    now = time.time()
    record = {
        "done": int(done),
        "total": int(total),
        "unit": unit,
        "updated": now,
        "started": now if started is None else started,
    }
    write_json(path, record)


def read_progress(path: str | Path) -> dict[str, Any] | None:
    """The progress record at `path`, or None when there is none or it is not one."""
    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    keys = {"done", "total", "unit", "updated", "started"}
    return record if isinstance(record, dict) and keys <= record.keys() else None


class ProgressWriter:
    """Writes one step's progress at most every `every_s` seconds (and always the first time)."""

    def __init__(self, path: Path, total: int, unit: str, every_s: float = EVERY_S):
        self.path, self.total, self.unit, self.every_s = path, total, unit, every_s
        self.started = time.time()
        self._last = -float("inf")

    def update(self, done: int, force: bool = False) -> None:
        """Record `done` of `total`, unless the file was written less than `every_s` ago."""
        if force or time.monotonic() - self._last >= self.every_s:
            write_progress(self.path, done, self.total, self.unit, self.started)
            self._last = time.monotonic()
