"""Run seeds in worker processes, one per device (gpuflow.job.workers), and survive workers
that die: a dead worker's seeds go to the others, a seed that killed two workers fails.
"""

from __future__ import annotations

import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from gpuflow.job import Done, WorkerPool


@dataclass
class Outcome:
    """What became of one seed: a result row, or an error text."""

    seed: int
    row: dict[str, Any] | None = None
    error: str | None = None


def _seed_runner(
    target: str, settings: dict[str, Any], device: str
) -> Callable[[int], dict[str, Any]]:
    """In a worker: `target` ('module:function') bound to the settings and the device."""
    import torch

    torch.set_num_threads(1)
    return partial(pkgutil.resolve_name(target), settings, device=torch.device(device))


class SeedPool:
    """Run `target(settings, seed, device)` for every seed across one worker per device."""

    def __init__(
        self, target: str, settings: dict[str, Any], devices: list[str], log: Callable[[str], None]
    ):
        self.pool = WorkerPool(
            partial(_seed_runner, target, settings), devices, name="sweep", item="seed", log=log
        )

    @property
    def deaths(self) -> list[str]:
        """One line per worker that died, for the run record."""
        return self.pool.deaths

    def run(self, seeds: list[int], report: Callable[[Outcome], None]) -> None:
        """Run all seeds; call `report` once per seed, in the order they finish."""

        def outcome(done: Done) -> None:
            report(Outcome(int(done.key), row=done.result, error=done.error))

        self.pool.run({seed: seed for seed in seeds}, outcome)
