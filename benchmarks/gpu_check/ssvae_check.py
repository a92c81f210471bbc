"""SSVAE rows: one M2 run, R runs one after another, R runs stacked (the workflow's trainer).

The stacked runs must reproduce the runs trained one after another (same seeds, same labelled
subsets, same noise streams), and every run's first-step loss must equal M2's loss written out
plainly (benchmarks.gpu_check.ssvae_reference), which shares no code with the trainer's model;
the stacked rate projects the GPU-hours of the paper grid.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from benchmarks.gpu_check.rows import CheckRow, max_relative_difference
from benchmarks.gpu_check.ssvae_reference import m2_loss
from gpuflow.job.devices import describe_device
from gpuflow.scaling.distributed import synchronize
from gpuflow.settings.validate import merge_config
from gpuflow.ssvae.batches import epoch_indices
from gpuflow.ssvae.data import synthetic_mnist
from gpuflow.ssvae.flops import train_flops_per_example
from gpuflow.ssvae.train import Run, StackTrainer, train_settings
from gpuflow.ssvae.work import shape as ssvae_shape

TOLERANCE = 1e-3
REFERENCE_TOLERANCE = 1e-4  # fp32 rounding; the entropy of q(y|x) alone moves the loss ~0.4%
ALPHA = 1.0


def _batches(trainer: StackTrainer) -> Iterator[dict[str, torch.Tensor]]:
    while True:
        indices = epoch_indices(trainer.index, trainer.plan, trainer.order_rng, True)
        yield from trainer.batches.epoch(indices, trainer.plan)


def next_noise(trainer: StackTrainer) -> tuple[torch.Tensor, torch.Tensor]:
    """(eps_l, eps_u) the trainer's next step draws; its noise streams are left where they were,
    so that step draws the same."""
    states = [generator.get_state() for generator in trainer.noise_rng]
    noise = trainer.step_noise()
    for generator, state in zip(trainer.noise_rng, states, strict=True):
        generator.set_state(state)
    return noise


def train_steps(
    seeds: list[int],
    data: dict[str, np.ndarray],
    settings: dict[str, Any],
    steps: int,
    device: torch.device,
    fraction: float,
) -> tuple[np.ndarray, float, StackTrainer, np.ndarray]:
    """Each step's loss of the runs `seeds` trained stacked ([steps, R]), seconds after step 1,
    the trainer, and each run's first-step loss by the plain M2 reference ([R])."""
    runs = [Run("m2", fraction, 0.0, ALPHA, seed) for seed in seeds]
    trainer = StackTrainer(runs, data, settings, [device])
    stream = _batches(trainer)
    first = next(stream)
    eps_l, eps_u = next_noise(trainer)
    reference = np.array(
        [m2_loss(trainer.model, r, first, eps_l, eps_u) for r in range(len(seeds))]
    )
    losses = [trainer.train_step(first)[0]]
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps - 1):
        losses.append(trainer.train_step(next(stream))[0])
    synchronize(device)
    seconds = time.perf_counter() - start
    return torch.stack(losses).cpu().numpy(), seconds, trainer, reference


def ssvae_rows(sizes_ssvae: dict[str, Any], device: torch.device, peak: float) -> list[CheckRow]:
    """One run, R one after another and R stacked, each with its examples/s and FLOP share."""
    s = sizes_ssvae
    data = synthetic_mnist(s["n_train"], s["n_test"], seed=0)
    settings = merge_config(
        train_settings(),
        {
            "model": {"hidden": s["hidden"], "latent": s["latent"]},
            "train": {
                "batch_size": s["batch_size"],
                "labelled_batch_size": s["labelled_batch_size"],
                "device": device.type,
            },
        },
    )
    seeds = list(range(s["stack"]))
    flops = train_flops_per_example(
        s["hidden"], s["latent"], s["batch_size"], s["labelled_batch_size"]
    )
    one_by_one, one_seconds, one_reference = [], [], []
    for seed in seeds:
        losses, seconds, trainer, reference = train_steps(
            [seed], data, settings, s["steps"], device, s["fraction"]
        )
        one_by_one.append(losses[:, 0])
        one_seconds.append(seconds)
        one_reference.append(reference[0])
    sequential = np.stack(one_by_one, axis=1)
    stacked, stacked_seconds, trainer, stacked_reference = train_steps(
        seeds, data, settings, s["steps"], device, s["fraction"]
    )
    plain = {
        "one": max_relative_difference(sequential[:1, 0], one_reference[:1]),
        "sequential": max_relative_difference(sequential[0], one_reference),
        "stacked": max_relative_difference(stacked[0], stacked_reference),
    }
    per_step = trainer.plan.labelled_batch + trainer.plan.unlabelled_batch
    timed_steps = s["steps"] - 1
    examples_per_run = trainer.plan.steps * per_step * s["epochs"]
    timed = {"one": one_seconds[0], "sequential": sum(one_seconds), "stacked": stacked_seconds}
    runs = {"one": 1, "sequential": len(seeds), "stacked": len(seeds)}
    rates = {key: per_step * timed_steps * runs[key] / timed[key] for key in timed}
    first_losses = {"one": sequential[0, :1], "sequential": sequential[0], "stacked": stacked[0]}
    deviation_one = max_relative_difference(sequential[:, 0], stacked[:, 0])
    deviation_all = max_relative_difference(sequential.ravel(), stacked.ravel())
    tolerance = (
        f"first-step loss of each run within {REFERENCE_TOLERANCE:g} (relative) of M2 written "
        f"out plainly; max relative loss difference <= {TOLERANCE:g} over {s['steps']} steps"
    )
    names = {
        "one": "ssvae M2 one run",
        "sequential": f"ssvae M2 {len(seeds)} runs one after another",
        "stacked": f"ssvae M2 {len(seeds)} runs stacked",
    }
    rows = []
    for key, deviation, against in (
        ("one", deviation_one, "run 0 of the stack"),
        ("sequential", deviation_all, "the stacked runs"),
        ("stacked", deviation_all, "the runs one after another"),
    ):
        hours = s["grid_runs"] * examples_per_run / rates[key] / 3600
        rows.append(
            CheckRow(
                path=names[key],
                ok=bool(
                    plain[key] <= REFERENCE_TOLERANCE
                    and deviation <= TOLERANCE
                    and np.isfinite(stacked).all()
                ),
                tolerance=f"{tolerance} vs {against}",
                deviation=f"plain M2 {plain[key]:.2e}; {against} {deviation:.2e}",
                throughput=rates[key],
                unit="examples/s",
                tflops=rates[key] * flops / 1e12,
                peak_tflops=peak,
                seconds=timed[key],
                devices=[describe_device(device)],
                extra={
                    "first_step_loss": first_losses[key].tolist(),
                    "hidden": s["hidden"],
                    "latent": s["latent"],
                    "steps_per_epoch": trainer.plan.steps,
                    f"projected_gpu_hours_{s['grid_runs']}_run_grid_{s['epochs']}_epochs": round(
                        hours, 2
                    ),
                    "projection_excludes": "evaluation passes and job start-up",
                },
            )
        )
        if key != "sequential":
            batches = (trainer.plan.unlabelled_batch, trainer.plan.labelled_batch)
            shape = ssvae_shape("m2", s["hidden"], s["latent"], runs[key], *batches)
            rows[-1].rated("ssvae.m2.flop", shape)
    return rows
