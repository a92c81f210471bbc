"""Sweep row: seeds dealt to one worker process per device by the workflow's SeedPool."""

from __future__ import annotations

import time
from typing import Any

import torch

from benchmarks.gpu_check.rows import CheckRow, max_relative_difference
from gpuflow.job.devices import describe_device
from gpuflow.sweep.experiment import run_seed
from gpuflow.sweep.pool import Outcome, SeedPool
from gpuflow.sweep.shard import TARGET
from gpuflow.sweep.work import cell_shape, seed_settings

TOLERANCE = 1e-5


def sweep_row(sizes: dict[str, Any], devices: list[torch.device]) -> CheckRow:
    """Every seed through the pool's workers, against the same seed run in this process."""
    settings, seeds = sizes["settings"], list(range(sizes["seeds"]))
    outcomes: dict[int, Outcome] = {}
    pool = SeedPool(TARGET, settings, [str(d) for d in devices], log=lambda _: None)
    start = time.perf_counter()
    pool.run(seeds, lambda outcome: outcomes.__setitem__(outcome.seed, outcome))
    seconds = time.perf_counter() - start
    failed = [s for s, o in outcomes.items() if o.row is None]
    reference = [run_seed(settings, seed, devices[0])["test_error"] for seed in seeds]
    pooled = [outcomes[s].row["test_error"] if s not in failed else float("nan") for s in seeds]
    deviation = max_relative_difference(pooled, reference) if not failed else float("inf")
    method, rank, width = settings["method"], settings["teacher_rank"], settings["student_width"]
    return CheckRow(
        path=f"sweep {settings['method']} seeds on {len(devices)} worker process(es)",
        ok=bool(not failed and len(outcomes) == len(seeds) and deviation <= TOLERANCE),
        tolerance=f"every seed done; relative test-error difference <= {TOLERANCE:g} vs the "
        "same seed run in the checking process",
        deviation=f"{deviation:.2e}" + (f", failed seeds {failed}" if failed else ""),
        throughput=len(seeds) / seconds,
        unit="seeds/s",
        seconds=seconds,
        devices=sorted({describe_device(d) for d in devices}),
        extra={"worker_deaths": pool.deaths, "settings": settings},
    ).rated(
        f"sweep.{method}.seed", cell_shape(method, rank, width, seed_settings(settings, method))
    )
