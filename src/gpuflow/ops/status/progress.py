"""Progress of a running job, from the file its step keeps up to date, and an ETA from its rate.

Readers, first match wins:
- `<output>.progress.json` beside any output: {"done", "total", "unit", "updated", "started"}
  (unix times), written while perplexity/toxicity shards run;
- sweep shards: seeds finished in the shard's progress file (`gpuflow.sweep.progress`), of the
  seeds its log announces;
- SSVAE training: the last `epoch x/N` its log prints after each epoch (with the train state);
- DDP scaling training: the epochs its log records (one JSON line each, with the checkpoint),
  of the configuration's `train.epochs`.

A job resumed from its saved state says so in its log (epochs or seeds already done); those are
left out of the rate the ETA is computed from.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpuflow.ops.plan import Job
from gpuflow.progressfile import progress_path, read_progress
from gpuflow.sweep.progress import progress_path as sweep_progress_path


@dataclass
class Progress:
    """`done` of `total` `unit`, measured between `started` and `updated` (unix times).

    `resumed_at`: units already done when this attempt started (a resumed job), left out of
    the rate.
    """

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


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def from_progress_json(output: Path) -> Progress | None:
    """The progress file of a resumable shard (`gpuflow.progressfile`)."""
    path = progress_path(output)
    record = read_progress(path)
    if record is None:
        return None
    try:
        return Progress(
            done=float(record["done"]),
            total=float(record["total"]),
            unit=str(record["unit"]),
            started=float(record["started"]),
            updated=float(record["updated"]),
            source=str(path),
        )
    except (ValueError, TypeError):
        return None


SWEEP_SEEDS = re.compile(r": (\d+) seeds, (\d+) already done")


def from_sweep(output: Path, log: Path, started: float) -> Progress | None:
    """Seeds a sweep shard has finished (ok or failed), of those its log announces."""
    path = sweep_progress_path(output)
    announced = SWEEP_SEEDS.findall(_text(log))
    updated = _mtime(path)
    if updated is None or not announced:
        return None
    done = sum(
        1
        for line in _text(path).splitlines()
        if line.strip().startswith("{") and '"kind": "seed"' in line
    )
    total, resumed_at = announced[-1]
    return Progress(done, float(total), "seeds", started, updated, str(path), float(resumed_at))


SSVAE_EPOCH = re.compile(r"^epoch (\d+)/(\d+) ", re.MULTILINE)
SSVAE_RESUMED = re.compile(r"^resumed from .* after epoch (\d+)$", re.MULTILINE)
SCALING_RESUMED = re.compile(r"^resuming after epoch (\d+) from ", re.MULTILINE)


def _resumed_at(pattern: re.Pattern[str], text: str) -> float:
    found = pattern.findall(text)
    return float(found[-1]) if found else 0.0


def from_ssvae_log(log: Path, started: float) -> Progress | None:
    """The last `epoch x/N` line of an SSVAE training log."""
    text = _text(log)
    found = SSVAE_EPOCH.findall(text)
    updated = _mtime(log)
    if not found or updated is None:
        return None
    done, total = found[-1]
    resumed_at = _resumed_at(SSVAE_RESUMED, text)
    return Progress(float(done), float(total), "epochs", started, updated, str(log), resumed_at)


def from_scaling_log(log: Path, total: float | None, started: float) -> Progress | None:
    """Epochs a DDP training log records (one JSON line with "epoch" each)."""
    epochs = []
    text = _text(log)
    for line in text.splitlines():
        if line.startswith("{") and '"epoch"' in line:
            try:
                epochs.append(int(json.loads(line)["epoch"]))
            except (ValueError, KeyError, TypeError):
                continue
    updated = _mtime(log)
    if not epochs or updated is None or not total:
        return None
    resumed_at = _resumed_at(SCALING_RESUMED, text)
    return Progress(
        float(max(epochs)), float(total), "epochs", started, updated, str(log), resumed_at
    )


def scaling_epochs(config: dict[str, Any], job: Job) -> float | None:
    """`train.epochs` of the job's scaling configuration."""
    try:
        return float(config["scaling"]["configurations"][job.wildcards["cfg"]]["train"]["epochs"])
    except (KeyError, TypeError, ValueError):
        return None


def job_progress(
    job: Job, directory: str | Path, config: dict[str, Any], started: float
) -> Progress | None:
    """Progress of a running job, or None where its step keeps no progress."""
    root = Path(directory)

    def local(name: str) -> Path:
        return Path(name) if os.path.isabs(name) else root / name

    for output in job.output:
        found = from_progress_json(local(output))
        if found is not None:
            return found
    log = local(job.log[0]) if job.log else root / "-"
    if job.rule == "sweep_shard" and job.output:
        return from_sweep(local(job.output[0]), log, started)
    if job.rule == "ssvae_train":
        return from_ssvae_log(log, started)
    if job.rule.startswith("scaling_train"):
        return from_scaling_log(log, scaling_epochs(config, job), started)
    return None
