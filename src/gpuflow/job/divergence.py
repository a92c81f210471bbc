"""Stop a training run that diverged, naming the run, the epoch and what gave it away."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpuflow.errors import GpuflowError

SCALE_FLOOR = 1.0
ADVICE = " (lower the learning rate or check the data)"


class TrainingDivergedError(GpuflowError):
    """A loss term became NaN or infinite, or every step overflows at the lowest loss scale."""


def kept_state(epoch: int, state: Path | None) -> str:
    """What a stop at `epoch` leaves behind: the last good state, or none."""
    if state is not None and state.is_file():
        return f"the last good state (after epoch {epoch - 1}) is kept in {state}"
    return "no earlier state to keep"


def check_finite(run: str, epoch: int, terms: Mapping[str, float], state: Path | None) -> None:
    """Raise TrainingDivergedError when a loss term of `run` at `epoch` is not finite."""
    for name, value in terms.items():
        if not math.isfinite(float(value)):
            raise TrainingDivergedError(
                f"run {run}: loss term '{name}' is {float(value)} at epoch {epoch}; training"
                f" stopped, {kept_state(epoch, state)}" + ADVICE
            )


@dataclass
class SkippedSteps:
    """Optimizer steps a loss scaler skipped: all, and the current run of them at the floor."""

    limit: int
    total: int = 0
    at_floor: int = 0

    def observe(self, skipped: bool, scale: float) -> None:
        """Count one optimizer step, taken with loss scale `scale`, skipped or applied."""
        self.total += skipped
        self.at_floor = self.at_floor + 1 if skipped and scale <= SCALE_FLOOR else 0

    @property
    def diverged(self) -> bool:
        """Whether `limit` steps in a row were skipped with the scale at its floor."""
        return self.at_floor >= self.limit


def check_skipped(run: str, epoch: int, skipped: SkippedSteps, state: Path | None) -> None:
    """Raise TrainingDivergedError once `run` skipped `skipped.limit` steps in a row."""
    if skipped.diverged:
        raise TrainingDivergedError(
            f"run {run}: {skipped.at_floor} optimizer steps in a row overflowed with the fp16 loss"
            f" scale at its floor ({SCALE_FLOOR:g}) in epoch {epoch}; training stopped, "
            f"{kept_state(epoch, state)}" + ADVICE
        )
