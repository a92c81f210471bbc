"""The job context: everything that makes one step trustworthy, owned in one place."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType
from typing import Any

from gpuflow.job import attempt, stopping
from gpuflow.job.divergence import SkippedSteps, check_finite, check_skipped
from gpuflow.job.finished_states import release
from gpuflow.job.gpulock import gpus_for_this_process
from gpuflow.job.loop import Ranks, Units
from gpuflow.job.outputlock import exclusive_output, locks_this_process
from gpuflow.job.paths import PROGRESS, STATE, job_file
from gpuflow.job.record import job_record
from gpuflow.job.state import State, make_fingerprint
from gpuflow.job.telemetry.job import note
from gpuflow.job.tracking import TrackedRun, Tracking
from gpuflow.settings.blocks import family_settings


class Job:
    """One step's lifecycle. Use as a context manager (`with Job(step, outputs) as job`)."""

    active: Job | None = None

    def __init__(
        self,
        step: str,
        outputs: Sequence[str | Path],
        settings: Mapping[str, Any] | None = None,
    ):
        self.step = step
        self.outputs = [Path(o) for o in outputs]
        self.settings = dict(settings) if settings is not None else family_settings("telemetry")
        self.writer = locks_this_process()  # False in torchrun ranks but 0: rank 0 writes
        self.telemetry: Any = None
        self.tracking = Tracking(self.settings, step, self.outputs, self.writer)
        self._stack = ExitStack()
        self._state: State | None = None

    @property
    def first_output(self) -> Path:
        """The output that names the job's files."""
        if not self.outputs:
            raise ValueError(f"step {self.step} has no outputs to name its job files by")
        return self.outputs[0]

    # --- lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> Job:
        stopping.install()
        with ExitStack() as stack:
            if self.writer and self.outputs:
                for output in self.outputs:
                    stack.enter_context(exclusive_output(output))
                attempt.claim(self.first_output)
                stack.callback(attempt.release)
            stack.enter_context(gpus_for_this_process())
            interval_s = float(self.settings["interval_s"])
            self.telemetry = stack.enter_context(job_record(self.step, self.outputs, interval_s))
            stack.callback(self.tracking.close)
            self._stack = stack.pop_all()
        Job.active = self
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> bool | None:
        Job.active = None
        if self._state is not None and self._state.earlier_s:
            self.note(earlier_attempts_s=self._state.earlier_s)
        return self._stack.__exit__(kind, error, trace)

    def finish(self, code: int) -> int:
        """The step returned exit status `code`: mark it in the record; returns it."""
        return self.telemetry.finish(code) if self.telemetry is not None else code

    # --- resume state and progress -------------------------------------------------------
    def state(
        self,
        inputs: Iterable[str | Path] = (),
        settings: Any = None,
        identity: Any = None,
        fingerprint: str | None = None,
    ) -> State:
        """The job's resume state, fingerprinted by the content of `inputs`, the
        results-affecting `settings`, any other `identity` and the gpuflow version (or by a
        `fingerprint` the step computed itself of the same things)."""
        fingerprint = fingerprint or make_fingerprint(inputs, settings, identity)
        self._state = State(self.first_output, fingerprint)
        return self._state

    def units(
        self,
        state: State | None,
        total: int,
        unit: str,
        load: Callable[[dict[str, Any]], int],
        save: Callable[[], Mapping[str, Any]],
        map_location: Any = "cpu",
        ranks: Ranks | None = None,
    ) -> Units:
        """The step's `total` units, resumed from `state` by `load(saved)` (the units it holds);
        `finished(...)` after each saves `save()`, reports progress and honours a stop, in that
        order (gpuflow.job.loop). Only the writing process (rank 0) saves and reports."""
        return Units(state, total, unit, load, save, self.writer, map_location, ranks)

    def loop(
        self,
        state: State,
        total: int,
        unit: str,
        load: Callable[[dict[str, Any]], int],
        save: Callable[[], Mapping[str, Any]],
        map_location: Any = "cpu",
        ranks: Ranks | None = None,
    ) -> Iterator[int]:
        """The step's `units` in order: the numbers (1-based) of those still to run, each one
        finished (saved, reported, a stop honoured) once the loop's body has run it."""
        return self.units(state, total, unit, load, save, map_location, ranks).ordered()

    def release(self, outputs: Iterable[str | Path] | None = None) -> None:
        """The outputs are written: drop the state and progress files, or under the workflow
        keep them until the run has accepted `outputs` (default: the job's outputs)."""
        if not self.writer or not self.outputs:
            return
        files = [job_file(self.first_output, kind) for kind in (STATE, PROGRESS)]
        release(files, outputs=self.outputs if outputs is None else list(outputs))

    # --- guards ---------------------------------------------------------------------------
    def check_finite(self, run: str, epoch: int, terms: Mapping[str, float]) -> None:
        """Stop (TrainingDivergedError) when a loss term of `run` at `epoch` is not finite."""
        check_finite(run, epoch, terms, self._state.path if self._state else None)

    def check_skipped(self, run: str, epoch: int, skipped: SkippedSteps) -> None:
        """Stop (TrainingDivergedError) when `run` skipped too many overflowing fp16 steps in a
        row with the loss scale at its floor (gpuflow.job.divergence)."""
        check_skipped(run, epoch, skipped, self._state.path if self._state else None)

    # --- tracker --------------------------------------------------------------------------
    def track(self, params: Mapping[str, Any], output: str | Path | None = None) -> TrackedRun:
        """A training run in the experiment tracker (config `telemetry.tracker`), named by
        `output` (default: the first output) and tagged with the job's step, wildcards, SLURM
        job id, host and GPUs; `params`: its results settings and what tells it from the job's
        other runs. Only the writing process logs; with no tracker its calls do nothing."""
        return self.tracking.run(params, output)

    # --- record ---------------------------------------------------------------------------
    def note(self, **timings: float) -> None:
        """The step's own timings (data_wait_s, step_s, batch_size...) for the job record."""
        note(**timings)


def current(outputs: Sequence[str | Path] = ()) -> Job:
    """The job `gpuflow <step>` opened for this step; outside one, a bare job for `outputs`
    (locks and samples nothing, names the same files)."""
    if Job.active is not None:
        return Job.active
    return Job("-", outputs)
