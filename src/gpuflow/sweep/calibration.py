"""Sweep rates for `gpuflow calibrate`: seeds of a job's cell run as its workers run them
(one thread, the job's device), a few seeds each trial, new seeds every trial."""

from __future__ import annotations

import itertools
import time

from gpuflow.cost.calibrate import Need, Trial
from gpuflow.sweep.work import cell_settings

SEEDS = 2  # per trial
FIRST_SEED = 1_000_000  # far from the seeds the sweep itself runs


def seed_trial(need: Need) -> Trial:
    """Seeds/s of the job's cell."""
    import torch

    from gpuflow.sweep.experiment import run_seed

    method = need.wildcards["method"]
    rank, width = int(need.wildcards["rank"]), int(need.wildcards["width"])
    settings = cell_settings(need.config["sweep"], method, rank, width)
    device = torch.device(need.device)
    seeds = itertools.count(FIRST_SEED)
    run_seed(settings, next(seeds), device)

    def run() -> dict[str, float]:
        began = time.perf_counter()
        for _ in range(SEEDS):
            run_seed(settings, next(seeds), device)
        return {need.term.shape: SEEDS / (time.perf_counter() - began)}

    return Trial(need.term.kind, "seeds/s", f"{SEEDS} seeds of the cell", run, threads=1)


MEASURE = {"sweep.gd.seed": seed_trial, "sweep.gnc.seed": seed_trial}
