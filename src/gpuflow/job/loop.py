"""The resumable loop every long step runs, in the one order that keeps a stop safe.

    for epoch in job.loop(state, epochs, "epochs", load=trainer.load_state, save=trainer.state):
        ...one epoch of science...

Before the first unit the loop loads the job's state (`load(saved)` restores it and returns
the units it holds), says so, reports progress and holds stop requests (SIGTERM, SIGUSR1) for
itself. After each unit it saves `save()`, reports progress (forced at the last unit and while
a stop is pending, so that `gpuflow status` shows where the step stopped), then honours a stop
request: `Stopped`, one line saying after which unit and where the state is.

Steps whose units finish on their own, in any order (a shard's seeds, scored chunks), save
each unit themselves and count it with a `Tally`, which keeps the same order after the save.

Under DDP (`ranks`), rank 0 saves while every rank waits, and a stop asked of any rank stops
every rank after the same unit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from gpuflow.job import stopping
from gpuflow.job.progress import ProgressWriter

if TYPE_CHECKING:
    from gpuflow.job.context import Job
    from gpuflow.job.state import State


class Ranks(Protocol):
    """The processes of one DDP run, as the loop needs them."""

    def barrier(self) -> None:
        """Wait until every rank is here."""

    def any(self, flag: bool) -> bool:
        """Whether `flag` holds on any rank."""


class Tally:
    """A step's count of finished units: progress first, then a pending stop, after each save.

    Creating it holds stop requests until `advance` (the step saves between units, never in
    the middle of one)."""

    def __init__(
        self, job: Job, total: float, unit: str, done: float = 0, ranks: Ranks | None = None
    ):
        self.total, self.ranks = total, ranks
        self.progress: ProgressWriter = job.progress(total, unit, resumed_at=done)
        self.progress.update(done, force=True)
        stopping.defer()

    def stop_pending(self) -> bool:
        """Whether a stop was asked of this process (or, under DDP, of any rank)."""
        asked = stopping.requested() is not None
        return self.ranks.any(asked) if self.ranks is not None else asked

    def advance(self, done: float, where: str) -> None:
        """`done` units are finished and saved: report it; stop (`Stopped`, saying `where`)
        when a stop was asked."""
        stop = self.stop_pending()
        self.progress.update(done, force=stop or done >= self.total)
        stopping.stop_if_requested(where, anyone=stop)


def run_loop(
    job: Job,
    state: State,
    total: int,
    unit: str,
    load: Callable[[dict[str, Any]], int],
    save: Callable[[], dict[str, Any]],
    map_location: Any = "cpu",
    ranks: Ranks | None = None,
) -> Iterator[int]:
    """The job's resumable loop (`job.loop(...)`): the numbers (1-based) of the units still to
    run, saving `save()` into `state`, reporting progress and honouring a stop after each (see
    the module docstring)."""
    noun = unit.removesuffix("s")
    saved = state.load(map_location)
    done = 0 if saved is None else load(saved)
    if saved is not None and job.writer:
        print(f"resumed from {state.path} after {noun} {done}", flush=True)
    tally = Tally(job, total, unit, done, ranks)
    for number in range(done + 1, total + 1):
        yield number
        if job.writer:
            state.save(save())
        if ranks is not None:
            ranks.barrier()
        tally.advance(number, f"after {noun} {number} of {total}, state in {state.path}")
