"""The job context: everything that makes one step trustworthy, owned in one place.

`gpuflow.cli.main` opens one `Job` around every step. While it is open the job holds the locks
of its outputs (gpuflow.job.outputlock) and is the attempt that may write them
(gpuflow.job.attempt), the device locks it needs (gpuflow.job.gpulock), handles
SIGTERM/SIGUSR1 as a stop request (gpuflow.job.stopping) and samples what it uses; when the step
ends it writes the job record (gpuflow.job.record). A step reaches its job with `current()`
and asks it for its resume state (a `State` snapshot, or a `UnitLog` of units finished one by one),
its resumable `loop` over its units (or a `tally` of units it saves itself: gpuflow.job.loop),
which saves, reports progress and honours stop requests in the one safe order, and the NaN
guard; it writes no state, progress or lock file of its own. All job files are named by the first
output (gpuflow.job.paths).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType
from typing import Any

from gpuflow.job import attempt, stopping
from gpuflow.job.divergence import SkippedSteps, check_finite, check_skipped
from gpuflow.job.finished_states import release
from gpuflow.job.gpulock import gpus_for_this_process
from gpuflow.job.loop import Ranks, Tally, run_loop
from gpuflow.job.outputlock import exclusive_output, locks_this_process
from gpuflow.job.paths import PROGRESS, STATE, UNITS, job_file
from gpuflow.job.progress import ProgressWriter, progress_path
from gpuflow.job.record import job_record
from gpuflow.job.state import State, make_fingerprint
from gpuflow.job.telemetry.job import note
from gpuflow.job.unitlog import UnitLog
from gpuflow.settings.blocks import family_settings


class Job:
    """One step's lifecycle. Use as a context manager (`with Job(step, outputs) as job`).

    A Job that is not entered (`current(outputs)` outside `gpuflow <step>`: a test, a library
    call) locks and samples nothing but names the same files. `settings`: the job's own
    (config `telemetry`, see gpuflow.job.telemetry.settings); default: the schema's.
    """

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
        self._stack = ExitStack()
        self._state: State | UnitLog | None = None

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

    def unit_log(
        self, inputs: Iterable[str | Path] = (), settings: Any = None, identity: Any = None
    ) -> UnitLog:
        """The job's unit log (not yet opened), fingerprinted as `state` is: for a step whose
        units (a shard's seeds) finish on their own, in any order, on several workers."""
        self._state = UnitLog(self.first_output, make_fingerprint(inputs, settings, identity))
        return self._state

    def progress(self, total: float, unit: str, resumed_at: float = 0) -> ProgressWriter:
        """The job's progress file (`gpuflow status` reads it): `update(done)` as units finish.

        `resumed_at`: units already done when this attempt started (from its resume state).
        Only the writing process (rank 0) writes it.
        """
        path = progress_path(self.first_output) if self.writer else None
        return ProgressWriter(path, total, unit, resumed_at)

    # The step's resumable loop over its units: resume from `state`, then after each unit save,
    # report progress and honour a stop, in that order (gpuflow.job.loop.run_loop).
    loop = run_loop

    def tally(self, total: float, unit: str, done: float = 0, ranks: Ranks | None = None) -> Tally:
        """The count of units a step finishes and saves itself, in any order: progress, then
        a pending stop, after each save (gpuflow.job.loop.Tally)."""
        return Tally(self, total, unit, done, ranks)

    def release(self, outputs: Iterable[str | Path] | None = None) -> None:
        """The outputs are written: drop the state, unit log and progress files, or under the
        workflow keep them until the run has accepted `outputs` (default: the job's outputs)."""
        if not self.writer or not self.outputs:
            return
        files = [job_file(self.first_output, kind) for kind in (STATE, PROGRESS, UNITS)]
        release(files, outputs=self.outputs if outputs is None else list(outputs))

    # --- guards ---------------------------------------------------------------------------
    def check_finite(self, run: str, epoch: int, terms: Mapping[str, float]) -> None:
        """Stop (TrainingDivergedError) when a loss term of `run` at `epoch` is not finite."""
        check_finite(run, epoch, terms, self._state.path if self._state else None)

    def check_skipped(self, run: str, epoch: int, skipped: SkippedSteps) -> None:
        """Stop (TrainingDivergedError) when `run` skipped too many overflowing fp16 steps in a
        row with the loss scale at its floor (gpuflow.job.divergence)."""
        check_skipped(run, epoch, skipped, self._state.path if self._state else None)

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
