"""SSVAE rates for `gpuflow calibrate`: the stacked trainer's own step at a job's shape.

Digits are random (a step's cost does not depend on pixel values), the label split gives the
job's labelled batch, and the trainer runs with the job's settings on the job's threads.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from gpuflow.cost.calibrate import Need, Trial
from gpuflow.ssvae.flops import step_flops
from gpuflow.ssvae.work import runs_per_job

STEPS = 8  # an epoch, per trial


def synthetic_data(n_train: int) -> dict[str, np.ndarray]:
    """Random digits, labels cycling over the classes (every class can be labelled)."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(n_train + 100, 28, 28), dtype=np.uint8)
    labels = np.arange(n_train + 100) % 10
    return {
        "x_train": images[:n_train],
        "y_train": labels[:n_train],
        "x_test": images[n_train:],
        "y_test": labels[n_train:],
    }


def step_trial(need: Need) -> Trial:
    """FLOP/s of the job's stacked training step (M2 or the baseline)."""
    import torch

    from gpuflow.ssvae.train import Run, StackTrainer

    ssvae: dict[str, Any] = need.config["ssvae"]
    model = "m2" if need.term.kind == "ssvae.m2.flop" else "baseline"
    labelled = int(need.term.shape.rsplit("+", 1)[1])  # the job's labelled batch (work.shape)
    train = {**ssvae["train"], "device": need.device, "labelled_batch_size": labelled}
    settings = {**ssvae, "train": train}
    hidden, latent = ssvae["model"]["hidden"], ssvae["model"]["latent"]
    labelled = max(10, labelled)
    n_train = labelled + train["batch_size"] * STEPS  # an epoch of STEPS steps
    runs = runs_per_job(ssvae, model)
    fraction = labelled / n_train
    stack = [Run(model, fraction, 0.0, 1.0 if model == "m2" else None, s) for s in range(runs)]
    trainer = StackTrainer(stack, synthetic_data(n_train), settings, [torch.device(need.device)])
    bu, bl = trainer.plan.unlabelled_batch, trainer.plan.labelled_batch
    per_step = step_flops(model, hidden, latent, bu, bl)

    def run() -> dict[str, float]:
        began = time.perf_counter()
        trainer.train_epoch()  # as the job trains: the epoch's order, batches and steps
        if need.device == "cuda":
            torch.cuda.synchronize()
        flops = trainer.plan.steps * per_step * runs
        return {need.term.shape: flops / (time.perf_counter() - began)}

    run()
    return Trial(need.term.kind, "FLOP/s", f"{model} epochs of {STEPS} steps, {runs} runs", run)


MEASURE = {"ssvae.m2.flop": step_trial, "ssvae.baseline.flop": step_trial}
