"""Progress of a running job, from the one progress file every long step keeps, and an ETA."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpuflow.job.progress import progress_path, read_progress
from gpuflow.ops.plan import Job


@dataclass
class Progress:
    """`done` of `total` `unit`, measured between `started` and `updated` (unix times)."""

    done: float
    total: float
    unit: str
    started: float
    updated: float
    source: str
    resumed_at: float = 0.0

    def eta_s(self, now: float) -> float | None:
        """Seconds left at this attempt's rate so far (None before its first unit is done)."""
        elapsed, done_here = self.updated - self.started, self.done - self.resumed_at
        if done_here <= 0 or elapsed <= 0 or self.total <= 0:
            return None
        left = (self.total - self.done) * elapsed / done_here - (now - self.updated)
        return max(left, 0.0)

    def as_dict(self, now: float) -> dict[str, Any]:
        return {**asdict(self), "eta_s": self.eta_s(now)}


def job_progress(job: Job, directory: str | Path) -> Progress | None:
    """Progress of a running job, or None where its step keeps no progress file."""
    for output in job.output:
        path = progress_path(Path(directory) / output)
        record = read_progress(path)
        if record is None:
            continue
        numbers = ("done", "total", "started", "updated", "resumed_at")
        try:
            values = {key: float(record[key]) for key in numbers}
        except (ValueError, TypeError):
            continue
        return Progress(**values, unit=str(record["unit"]), source=str(path))
    return None
