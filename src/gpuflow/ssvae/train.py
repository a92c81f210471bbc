"""Train R stacked runs of one grid point (M2 or the labelled-only baseline) with resume."""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

# Building a torch optimizer imports torch._dynamo (1.5-2.5 CPU-s on the 2-core machines, a fifth
# of a short baseline job). Imported with this module, it is in the start-up that the plan times
# by importing the module, instead of missing from every training job's price.
import torch._dynamo
from torch import nn

from gpuflow.errors import ConfigError
from gpuflow.job import (
    Job,
    State,
    current,
    load_optimizer_state,
    run_record,
    worker_devices,
    write_json,
)
from gpuflow.settings.blocks import family_settings, results_of
from gpuflow.ssvae.batches import Batches, Plan, RunIndex, epoch_indices, make_plan
from gpuflow.ssvae.data import load_prepared
from gpuflow.ssvae.graph_step import GraphedStep
from gpuflow.ssvae.labels import LabelSplit, split_labels
from gpuflow.ssvae.model import StackedClassifier, StackedM2

INIT_STREAM, ORDER_STREAM, NOISE_STREAM, EVAL_STREAM = 3, 4, 5, 6


@dataclass(frozen=True)
class Run:
    """One run of the grid."""

    model: str  # "m2" or "baseline"
    frac: float
    corrupt: float
    alpha: float | None
    seed: int

    def describe(self) -> dict[str, Any]:
        """The run's fields by name, as metrics.json and the run's tracking record hold them."""
        return asdict(self)


def train_settings(settings: str = "{}", runtime: str = "{}") -> dict[str, Any]:
    """config['ssvae'] from the step's `--settings` and `--runtime` JSON, every default filled in
    by the schema; the training reads its `model` and `train` blocks."""
    return family_settings("ssvae", settings, runtime)


def training_results(settings: dict[str, Any]) -> dict[str, Any]:
    """The results keys of the blocks the training reads: its fingerprint and its record."""
    return results_of("ssvae", {block: settings[block] for block in ("model", "train")})


def stream_seed(seed: int, stream: int) -> int:
    """A 63-bit seed for one random stream of one run."""
    return int(np.random.SeedSequence([seed, stream]).generate_state(1, np.uint64)[0] >> 1)


def generators(seeds: list[int], stream: int, device: torch.device) -> list[torch.Generator]:
    return [torch.Generator(device=device).manual_seed(stream_seed(s, stream)) for s in seeds]


def choose_devices(
    device: str, gpu_ids: list[int] | None, no_multi_gpu: bool
) -> list[torch.device]:
    """Every visible GPU (or those in gpu_ids), only the first with no_multi_gpu, else the CPU."""
    devices = worker_devices(device)
    if devices[0].type == "cpu":
        if gpu_ids:
            raise ConfigError("ssvae.train.gpu_ids", f"{gpu_ids} given but no GPU is visible")
        return devices[:1]
    if gpu_ids:
        unknown = [i for i in gpu_ids if not 0 <= i < len(devices)]
        if unknown:
            raise ConfigError("ssvae.train.gpu_ids", f"{unknown} not visible", f"< {len(devices)}")
        devices = [torch.device("cuda", i) for i in gpu_ids]
    return devices[:1] if no_multi_gpu else devices


def pixels(images: np.ndarray) -> torch.Tensor:
    """uint8 images (N x 28 x 28) as flat float rows in [0, 1]."""
    return torch.from_numpy(images.reshape(len(images), -1)).float() / 255


class StackTrainer:
    """The state and loop of R stacked runs that share a grid point's shapes."""

    def __init__(
        self,
        runs: list[Run],
        data: dict[str, np.ndarray],
        settings: dict[str, Any],
        devices: list[torch.device],
    ):
        self.runs, self.devices = runs, devices
        self.hidden, self.latent = settings["model"]["hidden"], settings["model"]["latent"]
        self.train_config = train = settings["train"]
        self.device = devices[0]
        self.m2 = runs[0].model == "m2"
        seeds = [r.seed for r in runs]
        self.splits: list[LabelSplit] = [
            split_labels(data["y_train"], r.frac, r.corrupt, r.seed) for r in runs
        ]
        self.index = RunIndex(
            labelled=torch.from_numpy(np.stack([s.labelled for s in self.splits])),
            labels=torch.from_numpy(np.stack([s.labels for s in self.splits])),
            unlabelled=torch.from_numpy(np.stack([s.unlabelled for s in self.splits])),
        )
        self.plan: Plan = make_plan(
            self.index.labelled.shape[1],
            self.index.unlabelled.shape[1],
            train["batch_size"],
            train["labelled_batch_size"],
        )
        self.batches = Batches(pixels(data["x_train"]), self.device, train)
        self.x_test = pixels(data["x_test"]).to(self.device)
        self.y_test = torch.from_numpy(data["y_test"]).to(self.device)
        self.validation = None
        if "x_val" in data:
            self.validation = (
                pixels(data["x_val"]).to(self.device),
                torch.from_numpy(data["y_val"]).to(self.device),
            )
        if self.m2:
            alphas = torch.tensor([r.alpha for r in runs], dtype=torch.float32)
            self.model: nn.Module = StackedM2(
                len(runs), self.hidden, self.latent, alphas, self.bound_weights()
            )
        else:
            self.model = StackedClassifier(len(runs), self.hidden)
        self.model.reset(generators(seeds, INIT_STREAM, torch.device("cpu")))
        self.model.to(self.device)
        self.net = self.model
        if len(devices) > 1:  # DataParallel over the batch dimension (1)
            self.net = nn.DataParallel(self.model, device_ids=[d.index for d in devices], dim=1)
        self.optimizer = torch.optim.Adam(  # fused: one kernel per step, not ~10 per tensor
            self.model.parameters(), lr=train["learning_rate"], fused=True, capturable=True
        )
        one_device = self.net is self.model  # not split by DataParallel
        self.graphed = GraphedStep(
            self._step,
            list(self.model.parameters()),
            self.optimizer,
            capture=self.device.type == "cuda" and one_device and train["graph_step"],
            setting="ssvae.train.graph_step",
        )
        self.order_rng = generators(seeds, ORDER_STREAM, torch.device("cpu"))
        self.noise_rng = generators(seeds, NOISE_STREAM, self.device)
        self.epoch = 0
        self.curve: list[list[dict[str, Any]]] = [[] for _ in runs]
        self.train_time_s = 0.0
        self.resumed_from: int | None = None  # the epoch a resume state held
        self.data_wait_s = 0.0  # this process only (host time waiting for the next batch)

    def bound_weights(self) -> torch.Tensor:
        """[R] weight of each run's labelled bound (ssvae.train.labelled_bound_weight)."""
        if self.train_config["labelled_bound_weight"] == "one":
            return torch.ones(len(self.runs))
        return torch.tensor(
            [len(s.labelled) / len(s.unlabelled) for s in self.splits], dtype=torch.float32
        )

    # --- state -------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """What a resumed run needs to continue exactly where this one is."""
        return {
            "epoch": self.epoch,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "order_rng": [g.get_state() for g in self.order_rng],
            "noise_rng": [g.get_state() for g in self.noise_rng],
            "curve": self.curve,
            "train_time_s": self.train_time_s,
        }

    def load_state(self, state: dict[str, Any]) -> int:
        """Continue from a saved `state()`; returns the epochs it holds."""
        self.model.load_state_dict(state["model"])
        load_optimizer_state(self.optimizer, state["optimizer"])
        for key, rngs in (("order_rng", self.order_rng), ("noise_rng", self.noise_rng)):
            for g, s in zip(rngs, state[key], strict=True):
                g.set_state(s)
        self.epoch, self.curve = state["epoch"], state["curve"]
        self.train_time_s = state["train_time_s"]
        self.graphed.reset()  # the optimizer's state tensors are new ones
        self.resumed_from = self.epoch
        return self.epoch

    # --- training ------------------------------------------------------------------------
    def _noise(self, rng: list[torch.Generator], *shape: int) -> torch.Tensor:
        """[R, *shape] standard normal noise, run r's drawn from rng[r]."""
        return torch.stack([torch.randn(shape, generator=g, device=self.device) for g in rng])

    def step_noise(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(eps_l, eps_u): the noise of one M2 step, [R, labelled, latent] and
        [R, unlabelled, 10, latent], drawn from the runs' noise streams."""
        eps_l = self._noise(self.noise_rng, self.plan.labelled_batch, self.latent)
        return eps_l, self._noise(self.noise_rng, self.plan.unlabelled_batch, 10, self.latent)

    def train_step(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """One Adam step of every run; returns [4, R] loss, labelled, unlabelled, CE (detached)."""
        if self.m2:
            eps_l, eps_u = self.step_noise()
            return self.graphed(batch["x_l"], batch["y_l"], batch["x_u"], eps_l, eps_u)
        return self.graphed(batch["x_l"], batch["y_l"])

    def _step(self, *inputs: torch.Tensor) -> torch.Tensor:
        out = self.net(*inputs)
        unlabelled = out["unlabelled"].mean(1) if self.m2 else torch.zeros_like(out["ce"][:, 0])
        labelled = out["labelled"].mean(1)
        per_run = labelled + unlabelled
        self.optimizer.zero_grad(set_to_none=True)
        per_run.sum().backward()
        self.optimizer.step()
        return torch.stack([per_run, labelled, unlabelled, out["ce"].mean(1)]).detach()

    def train_epoch(self) -> dict[str, np.ndarray]:
        indices = epoch_indices(self.index, self.plan, self.order_rng, unlabelled=self.m2)
        self.model.train()
        sums = torch.zeros(4, len(self.runs), device=self.device)
        mark = time.perf_counter()
        for batch in self.batches.epoch(indices, self.plan):
            self.data_wait_s += time.perf_counter() - mark
            sums += self.train_step(batch)
            mark = time.perf_counter()
        means = (sums / self.plan.steps).cpu().numpy()
        self.epoch += 1
        names = ("train_loss", "train_labelled", "train_unlabelled", "train_ce")
        return dict(zip(names, means, strict=True))

    def _accuracy(self, images: torch.Tensor, labels: torch.Tensor) -> np.ndarray:
        """[R] share of `images` [N, D] whose `labels` [N] each run's classifier predicts."""
        classifier = self.model.classifier if self.m2 else self.model
        correct = torch.zeros(len(self.runs), device=self.device)
        size = self.train_config["eval_batch_size"]
        for start in range(0, len(labels), size):
            x = images[start : start + size].expand(len(self.runs), -1, -1)
            correct += (classifier.logits(x).argmax(-1) == labels[start : start + size]).sum(1)
        return (correct / len(labels)).cpu().numpy()

    @torch.no_grad()
    def evaluate(self) -> dict[str, np.ndarray]:
        """Test accuracy per run, for M2 also the test ELBO terms (one seeded z sample), and the
        validation accuracy where the data has a validation split."""
        self.model.eval()
        out = {"test_accuracy": self._accuracy(self.x_test, self.y_test)}
        if self.m2:
            runs, n_test = len(self.runs), len(self.y_test)
            rng = generators([r.seed for r in self.runs], EVAL_STREAM, self.device)
            # drawn for the whole test set, so the batch size cannot change a sample
            noise_l = self._noise(rng, n_test, self.latent)
            noise_u = self._noise(rng, n_test, 10, self.latent)
            keys = ("labelled_neg_elbo", "recon", "kl", "unlabelled_neg_bound")
            sums = {key: torch.zeros(runs, device=self.device) for key in keys}
            size = self.train_config["eval_batch_size"]
            for start in range(0, n_test, size):
                x = self.x_test[start : start + size].expand(runs, -1, -1)
                y = self.y_test[start : start + size].expand(runs, -1)
                lab = self.model.labelled_terms(x, y, noise_l[:, start : start + size])
                unlab = self.model.unlabelled_terms(x, noise_u[:, start : start + size])
                sums["labelled_neg_elbo"] += lab["neg_elbo"].sum(1)
                sums["recon"] += lab["recon"].sum(1)
                sums["kl"] += lab["kl"].sum(1)
                sums["unlabelled_neg_bound"] += unlab["neg_bound"].sum(1)
            out.update({f"test_{k}": (v / n_test).cpu().numpy() for k, v in sums.items()})
        if self.validation is not None:
            out["val_accuracy"] = self._accuracy(*self.validation)
        return out

    def examples_per_epoch(self) -> int:
        """Examples one run processes per epoch (labelled + unlabelled)."""
        per_step = self.plan.labelled_batch + (self.plan.unlabelled_batch if self.m2 else 0)
        return self.plan.steps * per_step


def resume_state(
    job: Job, runs: list[Run], settings: dict[str, Any], data_path: str | Path, device_type: str
) -> State:
    """The job's resume state, matching only the same runs, data file content, results-affecting
    settings and device type (runtime settings may change in between). CPU and CUDA draw the
    training noise from generators of their own, whose states do not load into each other."""
    return job.state(
        inputs=[data_path],
        settings=training_results(settings),
        identity={"runs": [r.describe() for r in runs], "device_type": device_type},
    )


def check_runs_finite(job: Job, runs: list[Run], epoch: int, row: dict[str, np.ndarray]) -> None:
    """Stop (TrainingDivergedError) when a run's loss term of this epoch is NaN or infinite."""
    terms = ("train_labelled", "train_unlabelled", "train_ce", "train_loss")
    for r, run in enumerate(runs):
        name = " ".join(f"{k}={v}" for k, v in run.describe().items())
        job.check_finite(name, epoch, {k: row[k][r] for k in terms})


def train(
    runs: list[Run],
    data_path: str | Path,
    settings: dict[str, Any],
    outs: list[str | Path],
) -> list[dict[str, Any]]:
    """Train the stacked runs to the end (resuming from the job's state when it matches); write
    each metrics.json."""
    started = time.perf_counter()
    if len(outs) != len(runs):
        raise ConfigError("--out", f"{len(outs)} outputs for {len(runs)} runs", "one per run")
    job = current(outs)
    data = load_prepared(data_path)
    train = settings["train"]
    devices = choose_devices(train["device"], train["gpu_ids"], train["no_multi_gpu"])
    trainer = StackTrainer(runs, data, settings, devices)
    state = resume_state(job, runs, settings, data_path, trainer.device.type)
    epochs, every = train["epochs"], train["eval_frequency"]
    results = training_results(settings)
    tracked = [
        job.track({**results, "run": run.describe()}, out)
        for run, out in zip(runs, outs, strict=True)
    ]
    for _ in job.loop(state, epochs, "epochs", load=trainer.load_state, save=trainer.state):
        t0 = time.perf_counter()
        row = trainer.train_epoch()
        if trainer.device.type == "cuda":
            torch.cuda.synchronize(trainer.device)
        trainer.train_time_s += time.perf_counter() - t0
        check_runs_finite(job, runs, trainer.epoch, row)
        evaluated = trainer.epoch % every == 0 or trainer.epoch == epochs
        if evaluated:
            row.update(trainer.evaluate())
        for r, curve in enumerate(trainer.curve):
            values = {k: float(v[r]) for k, v in row.items()}
            curve.append({"epoch": trainer.epoch, **values})
            tracked[r].log(trainer.epoch, values)
        accuracy = f" test accuracy {np.round(row['test_accuracy'], 4)}" if evaluated else ""
        print(
            f"epoch {trainer.epoch}/{epochs} loss {np.round(row['train_loss'], 3)}{accuracy}",
            flush=True,
        )
    metrics = write_metrics(job, trainer, settings, outs, started)
    for run, written in zip(tracked, metrics, strict=True):
        run.final(trainer.epoch, {k: written[k] for k in ("test_accuracy", "test_elbo")})
    job.release(outputs=outs)
    return metrics


def write_metrics(
    job: Job,
    trainer: StackTrainer,
    settings: dict[str, Any],
    outs: list[str | Path],
    started: float,
) -> list[dict[str, Any]]:
    """Write each run's metrics.json; its test results are the last epoch's, which is always
    evaluated (also where a resume found every epoch done: its curve holds them)."""
    examples = trainer.examples_per_epoch() * trainer.epoch
    per_run_rate = examples / trainer.train_time_s if trainer.train_time_s else None
    job.note(
        data_wait_s=trainer.data_wait_s,
        step_s=trainer.train_time_s / max(1, trainer.epoch * trainer.plan.steps),
        batch_size=trainer.plan.unlabelled_batch,
    )
    record = run_record(trainer.devices)
    written = []
    for r, (run, out) in enumerate(zip(trainer.runs, outs, strict=True)):
        split, last = trainer.splits[r], trainer.curve[r][-1]
        accuracy = last["test_accuracy"]
        metrics = {
            "family": "ssvae",
            **run.describe(),
            "n_train": int(len(trainer.index.labelled[r]) + len(trainer.index.unlabelled[r])),
            "n_test": len(trainer.y_test),
            "n_val": len(trainer.validation[1]) if trainer.validation else 0,
            "n_labelled": len(split.labelled),
            "n_corrupted": int(split.corrupted.sum()),
            "n_unlabelled": len(split.unlabelled),
            "epochs": trainer.epoch,
            "steps_per_epoch": trainer.plan.steps,
            "test_accuracy": accuracy,
            "test_error": 1.0 - accuracy,
            "test_elbo": {
                k.removeprefix("test_"): v
                for k, v in last.items()
                if k.startswith("test_") and k != "test_accuracy"
            },
            "curve": trainer.curve[r],
            "settings": training_results(settings),
            "timing": {
                "wall_time_s": time.perf_counter() - started,
                "train_time_s": trainer.train_time_s,
                "samples_per_s": per_run_rate,
                "stack_size": len(trainer.runs),
                "stack_samples_per_s": per_run_rate * len(trainer.runs) if per_run_rate else None,
                "resumed_from_epoch": trainer.resumed_from,
            },
            "run_record": record,
        }
        write_json(out, metrics)
        written.append(metrics)
    return written


def main(args: argparse.Namespace) -> None:
    """`gpuflow ssvae-train`."""
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = train_settings(args.settings, args.runtime)
    alpha = None if args.model == "baseline" else args.alpha
    if args.model == "m2" and alpha is None:
        raise ConfigError("--alpha", "required for M2 runs")
    runs = [Run(args.model, float(args.frac), float(args.corrupt), alpha, s) for s in args.seeds]
    train(runs, args.data, settings, args.out)
