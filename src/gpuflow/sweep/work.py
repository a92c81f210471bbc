"""The work of a sweep shard: its seeds of one cell, run by one worker process per device."""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from typing import Any

from gpuflow.work import Need, Term, Trial, Work, startup

TRIAL_SEEDS = 2  # per trial
FIRST_TRIAL_SEED = 1_000_000  # far from the seeds the sweep itself runs


def cell_shape(method: str, rank: int, width: int, settings: dict[str, Any]) -> str:
    """What a seed rate is measured at: the cell and (a digest of) what its seeds compute."""
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:8]
    return f"{method} r{rank} w{width} {digest}"


def seed_settings(sweep: dict[str, Any], method: str) -> dict[str, Any]:
    """The settings a seed's work depends on (its data and its method's settings)."""
    return {"data": sweep["data"], method: sweep[method]}


def cell_settings(sweep: dict[str, Any], method: str, rank: int, width: int) -> dict[str, Any]:
    """What each seed of a cell (method, teacher rank, student width) computes from."""
    return {
        "method": method,
        "teacher_rank": rank,
        "student_width": width,
        **seed_settings(sweep, method),
    }


def workers(sweep: dict[str, Any]) -> int:
    """Worker processes of a shard: its GPUs on a GPU, else config cpu_workers."""
    gpus = sweep["resources"]["sweep_shard"]["gpu"]
    return gpus if gpus and sweep["device"] != "cpu" else sweep["cpu_workers"]


def shard(config: dict[str, Any], wildcards: dict[str, str]) -> Work:
    """The work of one shard: start-up, its worker processes, its seeds."""
    sweep = config["sweep"]
    method, rank, width = wildcards["method"], int(wildcards["rank"]), int(wildcards["width"])
    start = int(wildcards["shard"]) * sweep["shard_size"]
    seeds = min(sweep["shard_size"], sweep["n_seeds"] - start)
    pool = workers(sweep)
    at = cell_shape(method, rank, width, seed_settings(sweep, method))
    return Work(
        (
            startup("gpuflow.sweep.shard"),
            startup("gpuflow.sweep.experiment", processes=pool, at_once=True),
            Term(
                f"sweep.{method}.seed",
                seeds,
                at,
                f"{seeds} seeds of {method} rank {rank} width {width}",
                pool,
            ),
        ),
        units=seeds,
        unit="seeds",
    )


def seed_trial(need: Need) -> Trial:
    """Seeds/s of the job's cell."""
    import torch

    from gpuflow.sweep.experiment import run_seed

    method = need.wildcards["method"]
    rank, width = int(need.wildcards["rank"]), int(need.wildcards["width"])
    settings = cell_settings(need.config["sweep"], method, rank, width)
    device = torch.device(need.device)
    seeds = itertools.count(FIRST_TRIAL_SEED)
    run_seed(settings, next(seeds), device)

    def run() -> float:
        began = time.perf_counter()
        for _ in range(TRIAL_SEEDS):
            run_seed(settings, next(seeds), device)
        return TRIAL_SEEDS / (time.perf_counter() - began)

    return Trial(need.term.kind, "seeds/s", f"{TRIAL_SEEDS} seeds of the cell", run, threads=1)


WORK = {"sweep_shard": shard}
TRIALS = {"sweep.gd.seed": seed_trial, "sweep.gnc.seed": seed_trial}
