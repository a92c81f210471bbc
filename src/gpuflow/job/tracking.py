"""Runs in an experiment tracker: TensorBoard event files, one folder per training run, continued
when its job resumes (docs/tracking.md)."""

from __future__ import annotations

import json
import math
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuflow.job.markdown import markdown_table
from gpuflow.job.paths import family_root
from gpuflow.job.telemetry.job import job_gpus

NONE, TENSORBOARD = "none", "tensorboard"
EVENT_FILES = "events.out.tfevents.*"
MISSING = "tensorboard is not installed (pip install 'gpuflow[tracking]')"


def flat(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested `values` as one level, names joined by dots (`train.epochs`)."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        key = f"{prefix}{name}"
        if isinstance(value, Mapping):
            out.update(flat(value, f"{key}."))
        else:
            out[key] = value
    return out


def hparam(value: Any) -> bool | int | float | str:
    """A value as TensorBoard's HParams take it: a number, a bool or a string (the rest as JSON)."""
    if isinstance(value, bool | int | float | str):
        return value
    return json.dumps(value, sort_keys=True)


def scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The numbers among `metrics` (nested ones by dotted name); None and text left out."""
    return {
        name: float(value)
        for name, value in flat(metrics).items()
        if isinstance(value, int | float)
    }


def wildcards(relative: Path) -> dict[str, str]:
    """The grid coordinates a path holds: its `name~value` parts."""
    parts = (part.split("~", 1) for part in relative.with_suffix("").parts if "~" in part)
    return {name: value for name, value in parts}


class Tracking:
    """The tracker of one job: where its runs go, the tags they carry, and the one line that says
    logging failed (after which the job's runs log nothing and the job goes on)."""

    def __init__(
        self, settings: Mapping[str, Any], step: str, outputs: Sequence[Path], writer: bool
    ):
        self.kind = settings.get("tracker", NONE)
        self.folder = Path(settings.get("tracker_folder") or ".")
        self.step, self.outputs = step, list(outputs)
        self.on = writer and bool(self.outputs) and self.kind != NONE
        self.runs: list[TrackedRun] = []

    def run(self, params: Mapping[str, Any], output: str | Path | None = None) -> TrackedRun:
        """The tracked run named by `output` (default: the job's first output), carrying
        `params` (its results settings and what tells it from its job's other runs)."""
        named_by = Path(output) if output is not None else (self.outputs or [Path("-")])[0]
        root = family_root(named_by)
        relative = named_by.relative_to(root)
        tags = {
            "family": root.name,
            "step": self.step,
            **wildcards(relative),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID", ""),
            "host": socket.gethostname(),
            "gpus": _gpus(),
        }
        folder = self.folder / root.name / relative.with_suffix("")
        run = TrackedRun(self, folder, flat(params), tags)
        self.runs.append(run)
        return run

    def failed(self, error: BaseException | str) -> None:
        """Logging failed: say so once, on stderr, and stop logging for this job."""
        if self.on:
            print(f"gpuflow: tracking off for this job: {error}", file=sys.stderr, flush=True)
        self.on = False

    def close(self) -> None:
        """Write out every run's events."""
        for run in self.runs:
            run.close()


def _gpus() -> str:
    visible = job_gpus()
    return "all" if visible is None else (visible or "none")


class TrackedRun:
    """One training run in the tracker. Its event writer opens at the first call; the first
    unit it logs is where a resumed run continues: a reader drops the earlier attempt's events
    from there on (`purge_step`), so every unit is in the run once."""

    def __init__(
        self, tracking: Tracking, folder: Path, params: dict[str, Any], tags: dict[str, str]
    ):
        self.tracking, self.folder, self.params, self.tags = tracking, folder, params, tags
        self.writer: Any = None
        self.end: Any = None  # the HParams summary that ends the run

    def log(self, unit: int, metrics: Mapping[str, Any]) -> None:
        """The numbers among `metrics` after `unit` (an epoch, a seed, a step; 1-based)."""
        self._do(self._log, unit, metrics)

    def final(self, unit: int, metrics: Mapping[str, Any]) -> None:
        """The run's final metrics (`final/<name>`) after its last `unit`; the run ends."""
        self._do(self._final, unit, metrics)

    def table(self, unit: int, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """`rows` as a Markdown table named `name`, after `unit`."""
        self._do(self._table, unit, name, rows)

    def close(self) -> None:
        """Write out the run's events."""
        if self.writer is not None:
            self._do(self.writer.close)
            self.writer = None

    # --- under the guard ----------------------------------------------------------------
    def _do(self, action: Any, *args: Any) -> None:
        if not self.tracking.on:
            return
        try:
            action(*args)
        except ImportError:
            self.tracking.failed(MISSING)
        except Exception as error:  # a tracker that fails never fails the run
            self.tracking.failed(f"{type(error).__name__}: {error}")

    def _open(self, first: int | None) -> Any:
        """The event writer; `first`: the unit this attempt logs first (None: no unit)."""
        if self.writer is not None:
            return self.writer
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        if first == 1:  # a fresh start: an earlier run of this job's outputs is gone
            for old in self.folder.glob(EVENT_FILES):
                old.unlink()
        purge = first if first is not None and first > 1 else None
        self.writer = SummaryWriter(str(self.folder), purge_step=purge, flush_secs=30)
        values = {name: hparam(v) for name, v in self.params.items()}
        values.update({f"tag.{name}": value for name, value in self.tags.items()})
        # No experiment summary: TensorBoard then joins every run's parameters in one table.
        _, start, self.end = hparams(values, {})
        self.writer.file_writer.add_summary(start)
        header, rows = ["tag", "value"], [[k, str(v)] for k, v in self.tags.items()]
        self.writer.add_text("tags", markdown_table(header, rows))
        return self.writer

    def _log(self, unit: int, metrics: Mapping[str, Any]) -> None:
        writer = self._open(unit)
        for name, value in scalars(metrics).items():
            if math.isfinite(value):
                writer.add_scalar(name, value, unit)
        writer.flush()  # on disk before the loop saves the unit's resume state

    def _final(self, unit: int, metrics: Mapping[str, Any]) -> None:
        writer = self._open(None)
        for name, value in scalars(metrics).items():
            writer.add_scalar(f"final/{name}", value, unit)
        writer.file_writer.add_summary(self.end)
        writer.flush()

    def _table(self, unit: int, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        writer = self._open(None)
        header = list(rows[0]) if rows else []
        cells = [["" if row.get(k) is None else str(row.get(k)) for k in header] for row in rows]
        writer.add_text(name, markdown_table(header, cells), unit)
        writer.flush()
