"""Stop a training run whose loss is no longer a number, naming the run, the epoch and the term.

A NaN or infinite loss would otherwise flow into the metrics as if it were a result. Training
checks each epoch's loss terms before it saves that epoch's state, so the resume state left
(gpuflow.job.state) is the last good one, for inspection (a re-run resumes from it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

from gpuflow.errors import GpuflowError


class TrainingDivergedError(GpuflowError):
    """A loss term became NaN or infinite."""


def first_bad_term(terms: Mapping[str, float]) -> tuple[str, float] | None:
    """The first (name, value) in `terms` that is NaN or infinite, else None."""
    for name, value in terms.items():
        if not math.isfinite(float(value)):
            return name, float(value)
    return None


def check_finite(run: str, epoch: int, terms: Mapping[str, float], state: Path | None) -> None:
    """Raise TrainingDivergedError when a loss term of `run` at `epoch` is not finite."""
    bad = first_bad_term(terms)
    if bad is None:
        return
    name, value = bad
    kept = (
        f"the last good state (after epoch {epoch - 1}) is kept in {state}"
        if state is not None and state.is_file()
        else "no earlier state to keep"
    )
    raise TrainingDivergedError(
        f"run {run}: loss term '{name}' is {value} at epoch {epoch}; training stopped, {kept}"
        " (lower the learning rate or check the data)"
    )
