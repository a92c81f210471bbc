"""Loops over units, resumable: one resume state and one safe order for every kind of loop."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from gpuflow.job import stopping
from gpuflow.job.progress import ProgressWriter, progress_path
from gpuflow.job.state import State


class Ranks(Protocol):
    """The processes of one DDP run, as the loop needs them."""

    def barrier(self) -> None:
        """Wait until every rank is here."""

    def any(self, flag: bool) -> bool:
        """Whether `flag` holds on any rank."""


class Units:
    """`total` units of a step, resumed from its `state` (None: nothing kept, nothing reported),
    saved by the `writer` only (docs/recovery.md)."""

    def __init__(
        self,
        state: State | None,
        total: int,
        unit: str,
        load: Callable[[dict[str, Any]], int],
        save: Callable[[], Mapping[str, Any]],
        writer: bool = True,
        map_location: Any = "cpu",
        ranks: Ranks | None = None,
    ):
        self.state, self.total, self.unit, self.save, self.ranks = state, total, unit, save, ranks
        saved = None if state is None else state.load(map_location)
        self.resumed = saved is not None
        self.done = 0 if saved is None else load(saved)
        path = progress_path(state.first_output) if writer and state is not None else None
        self.writer = path is not None
        self.progress = ProgressWriter(path, total, unit, resumed_at=self.done)
        self.progress.update(self.done, force=True)
        stopping.defer()

    def finished(self, done: int, where: str) -> None:
        """`done` units are finished: save the state, then report them, then stop (`Stopped`,
        saying `where`) when a stop was asked."""
        if self.state is not None and self.writer:
            self.state.save(self.save())
        if self.ranks is not None:
            self.ranks.barrier()
        asked = stopping.requested() is not None
        stop = self.ranks.any(asked) if self.ranks is not None else asked
        self.progress.update(done, force=stop or done >= self.total)
        stopping.stop_if_requested(where, anyone=stop)

    def ordered(self) -> Iterator[int]:
        """The numbers (1-based) of the units still to run, in order, each `finished` once the
        loop's body has run it."""
        noun = self.unit.removesuffix("s")
        saved_in = "" if self.state is None else f", state in {self.state.path}"
        if self.resumed and self.writer:
            print(f"resumed from {self.state.path} after {noun} {self.done}", flush=True)
        for number in range(self.done + 1, self.total + 1):
            yield number
            self.finished(number, f"after {noun} {number} of {self.total}{saved_in}")
