"""Scores that survive a stop: saved after every chunk of batches, resumed where they stopped."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpuflow.job import stopping
from gpuflow.job.context import current


def plan_chunks(batch_weights: Sequence[int], chunk_weight: int) -> list[range]:
    """Consecutive batches grouped into chunks weighing at least `chunk_weight` (the last less)."""
    chunks, start, weight = [], 0, 0
    for index, batch_weight in enumerate(batch_weights):
        weight += batch_weight
        if weight >= chunk_weight:
            chunks.append(range(start, index + 1))
            start, weight = index + 1, 0
    if start < len(batch_weights):
        chunks.append(range(start, len(batch_weights)))
    return chunks


class ChunkedScores:
    """Per-item score columns of one output, resumed, filled batch by batch, saved by chunk."""

    def __init__(
        self,
        out: str | Path | None,
        fingerprint: str,
        batches: Sequence[np.ndarray],
        weights: Sequence[int],
        chunk_weight: int,
        columns: dict[str, type],
        unit: str,
    ):
        n_items = sum(len(b) for b in batches)
        self.job = current([] if out is None else [out])
        self.state = None if out is None else self.job.state(fingerprint=fingerprint)
        self.state_file = None if self.state is None else self.state.path
        self.batches, self.weights = list(batches), np.asarray(weights, dtype=np.int64)
        self.chunks = plan_chunks(weights, chunk_weight)
        self.chunk_of = [number for number, chunk in enumerate(self.chunks) for _ in chunk]
        self.values = {name: np.zeros(n_items, dtype=dtype) for name, dtype in columns.items()}
        self.done = np.zeros(n_items, dtype=bool)
        self.batch_done = np.zeros(len(self.batches), dtype=bool)
        self.total = int(self.weights.sum())
        self.units = self.job.units(self.state, self.total, unit, self._restore, self._snapshot)
        self.resumed_chunks, self.resumed_weight = self.chunks_done(), self.weight_done()

    def todo(self) -> list[int]:
        """The batches still to score (all but those the resume state holds)."""
        return [int(b) for b in np.flatnonzero(~self.batch_done)]

    def _restore(self, state: dict[str, Any]) -> int:
        """Take up the done flags and scores saved for this output; returns what they hold."""
        try:
            done = state["done"].numpy().copy()
            values = {name: state["values"][name].numpy().copy() for name in self.values}
        except (KeyError, TypeError, AttributeError):
            done, values = np.zeros(0, dtype=bool), {}
        if (
            done.shape != self.done.shape
            or values.keys() != self.values.keys()
            or any(
                v.shape != done.shape or v.dtype != self.values[n].dtype for n, v in values.items()
            )
        ):
            print(f"ignoring {self.state_file}: not a scores state; starting over", flush=True)
            return 0
        self.done, self.values = done, values
        self.batch_done = np.array([bool(done[b].all()) for b in self.batches], dtype=bool)
        print(
            f"resumed from {self.state_file} with {self.chunks_done()} of"
            f" {len(self.chunks)} chunks scored",
            flush=True,
        )
        return self.weight_done()

    def _snapshot(self) -> dict[str, Any]:
        """The scores so far, as the resume state keeps them."""
        return {
            "done": torch.from_numpy(self.done),
            "values": {name: torch.from_numpy(v) for name, v in self.values.items()},
        }

    def chunks_done(self) -> int:
        """Chunks whose batches are all scored."""
        return sum(bool(self.batch_done[c.start : c.stop].all()) for c in self.chunks)

    def weight_done(self) -> int:
        """Tokens (or texts) scored so far, resumed ones included."""
        return int(self.weights[self.batch_done].sum())

    def record(self, batch: int, values: dict[str, np.ndarray]) -> None:
        """Store one batch's scores; save, report and honour a stop once its chunk is complete."""
        items = self.batches[batch]
        for name, column in values.items():
            self.values[name][items] = column
        self.done[items] = True
        self.batch_done[batch] = True
        chunk = self.chunks[self.chunk_of[batch]]
        if self.batch_done[chunk.start : chunk.stop].all():
            self._finished()

    def _finished(self) -> None:
        """Save every score so far, report them and honour a pending stop (gpuflow.job.loop)."""
        where = "" if self.state_file is None else f" in {self.state_file}"
        where = f"after {self.chunks_done()} of {len(self.chunks)} chunks (state saved{where})"
        self.units.finished(self.weight_done(), where)

    @staticmethod
    def stop_pending() -> bool:
        """Whether SIGTERM or SIGUSR1 asked the step to stop."""
        return stopping.requested() is not None

    def stop_if_requested(self) -> None:
        """Once the workers are done: a stop request saves what was scored and ends the step."""
        if self.stop_pending() and not self.batch_done.all():
            self._finished()

    def record_fields(self, unit: str) -> dict[str, Any]:
        """For the run record: chunks and `unit` resumed from a state vs scored in this run."""
        return {
            "chunks": len(self.chunks),
            "chunks_resumed": self.resumed_chunks,
            "chunks_scored": len(self.chunks) - self.resumed_chunks,
            f"{unit}_resumed": self.resumed_weight,
            f"{unit}_scored": self.total - self.resumed_weight,
        }
