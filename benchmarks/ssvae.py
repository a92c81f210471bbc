"""SSVAE M2 training throughput: a straightforward reference loop against gpuflow.

Prints examples/s (labelled + unlabelled, summed over runs) for
  1. a reference loop like common public M2 reimplementations: DataLoader(num_workers=0),
     [x, onehot(y)] concatenated, the unlabelled bound's 10 classes enumerated in a Python loop;
  2. gpuflow, one run (device-resident data, index batching, batched matmuls, x W_x shared by the
     10 classes);
  3. gpuflow, R runs stacked in one model (on a GPU also without the CUDA graph of its step);
and the ratios, plus the FLOP-bound ceiling: this machine's rate on the same batched matmuls
divided by gpuflow's matmul FLOPs per example. Run: python benchmarks/ssvae.py [--device cuda]
"""

from __future__ import annotations

import argparse
import itertools
import math
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gpuflow.settings.validate import merge_config
from gpuflow.ssvae.batches import epoch_indices
from gpuflow.ssvae.data import split_embedded
from gpuflow.ssvae.flops import matmul_shapes
from gpuflow.ssvae.train import Run, StackTrainer, train_settings

D, K = 784, 10


class ReferenceM2(nn.Module):
    """M2 as public reimplementations write it: nn.Linear on concatenated inputs."""

    def __init__(self, hidden: int, latent: int):
        super().__init__()
        self.classifier = nn.Sequential(nn.Linear(D, hidden), nn.Softplus(), nn.Linear(hidden, K))
        self.encoder = nn.Sequential(nn.Linear(D + K, hidden), nn.Softplus())
        self.mu, self.logvar = nn.Linear(hidden, latent), nn.Linear(hidden, latent)
        self.decoder = nn.Sequential(
            nn.Linear(latent + K, hidden), nn.Softplus(), nn.Linear(hidden, D)
        )

    def neg_elbo(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.encoder(torch.cat([x, y], dim=1))
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        logits = self.decoder(torch.cat([z, y], dim=1))
        recon = F.binary_cross_entropy_with_logits(logits, x, reduction="none").sum(1)
        kl = 0.5 * (mu.pow(2) + logvar.exp() - 1 - logvar).sum(1)
        return recon + kl + math.log(K)


def reference_step(data, hidden, latent, device, alpha=10.0):
    """The reference: one training step per call; returns (step, examples per step)."""
    x = torch.from_numpy(data["x_train"].reshape(-1, D)).float() / 255
    y = torch.from_numpy(data["y_train"])
    n_l = 100
    labelled = DataLoader(
        TensorDataset(x[:n_l], y[:n_l]), batch_size=100, shuffle=True, num_workers=0
    )
    unlabelled = DataLoader(TensorDataset(x[n_l:]), batch_size=100, shuffle=True, num_workers=0)
    model = ReferenceM2(hidden, latent).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-4)
    pairs = zip(itertools.cycle(unlabelled), itertools.cycle(labelled))

    def step() -> None:
        (xu,), (xl, yl) = next(pairs)
        xu, xl, yl = xu.to(device), xl.to(device), yl.to(device)
        loss_l = model.neg_elbo(xl, F.one_hot(yl, K).float()) + alpha * F.cross_entropy(
            model.classifier(xl), yl, reduction="none"
        )
        log_q = torch.log_softmax(model.classifier(xu), dim=1)
        loss_u = torch.zeros(len(xu), device=device)
        for label in range(K):
            onehot = F.one_hot(torch.full((len(xu),), label, device=device), K).float()
            q = log_q[:, label].exp()
            loss_u = loss_u + q * (model.neg_elbo(xu, onehot) + log_q[:, label])
        loss = loss_l.mean() + loss_u.mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return step, 200


def gpuflow_step(data, hidden, latent, runs, device, graph_step=True):
    """gpuflow's trainer with `runs` stacked runs; returns (step, examples per step).

    `graph_step` (ssvae.train.graph_step): on a GPU, the step replayed as one CUDA graph."""
    settings = merge_config(
        train_settings(),
        {
            "model": {"hidden": hidden, "latent": latent},
            "train": {"device": device.type, "graph_step": graph_step},
        },
    )
    stack = [Run("m2", 0.025, 0.0, 10.0, seed) for seed in range(runs)]
    trainer = StackTrainer(stack, data, settings, [device])

    def batches():
        while True:
            indices = epoch_indices(trainer.index, trainer.plan, trainer.order_rng, True)
            yield from trainer.batches.epoch(indices, trainer.plan)

    stream = batches()
    per_step = (trainer.plan.labelled_batch + trainer.plan.unlabelled_batch) * runs
    return (lambda: trainer.train_step(next(stream))), per_step


def best_rates(
    methods: dict[str, tuple], steps: dict[str, int], trials: int, device: torch.device
) -> dict[str, float]:
    """Examples/s of each method's fastest of `trials` blocks of its `steps` steps, after one
    warm-up step each.

    The methods take turns block by block, so a slow spell of a shared machine slows every
    method alike, and the best block is the least disturbed by other work.
    """
    for step, _ in methods.values():
        step()
    synchronize(device)
    best = dict.fromkeys(methods, 0.0)
    for _ in range(trials):
        for name, (step, per_step) in methods.items():
            start = time.perf_counter()
            for _ in range(steps[name]):
                step()
            synchronize(device)
            best[name] = max(best[name], per_step * steps[name] / (time.perf_counter() - start))
    return best


def flop_ceiling(hidden, latent, runs, device, repeats) -> tuple[float, float]:
    """(matmul FLOP/s on the step's shapes, training FLOPs per example = 3 x forward)."""
    shapes = matmul_shapes(hidden, latent, runs)
    operands = [
        (torch.randn(b, m, k, device=device), torch.randn(b, k, n, device=device))
        for b, m, k, n in shapes
    ]
    flops = sum(2 * b * m * k * n for b, m, k, n in shapes)
    for a, w in operands:
        torch.bmm(a, w)
    synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        for a, w in operands:
            torch.bmm(a, w)
    synchronize(device)
    rate = flops * repeats / (time.perf_counter() - start)
    return rate, 3 * flops / (runs * 200)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--hidden", type=int, default=500, help="paper: 500")
    parser.add_argument("--latent", type=int, default=50, help="paper: 50")
    parser.add_argument("--runs", type=int, default=10, help="stacked runs")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per method")
    parser.add_argument("--trials", type=int, default=5, help="timed blocks; the best counts")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    data = split_embedded(0.2, seed=0)
    print(
        f"device {device}, torch threads {torch.get_num_threads()}, hidden {args.hidden}, "
        f"latent {args.latent}, batch 100 unlabelled + 100 labelled per run and step"
    )
    methods = {
        "reference": reference_step(data, args.hidden, args.latent, device),
        "one": gpuflow_step(data, args.hidden, args.latent, 1, device),
        "stacked": gpuflow_step(data, args.hidden, args.latent, args.runs, device),
    }
    steps = {"reference": args.steps, "one": args.steps, "stacked": max(1, args.steps // 4)}
    if device.type == "cuda":  # on the CPU the step is never captured: the same row twice
        methods["eager"] = gpuflow_step(data, args.hidden, args.latent, args.runs, device, False)
        steps["eager"] = steps["stacked"]
    rates = best_rates(methods, steps, args.trials, device)
    reference, one, stacked = rates["reference"], rates["one"], rates["stacked"]
    rate, per_example = max(
        flop_ceiling(args.hidden, args.latent, args.runs, device, repeats=2)
        for _ in range(args.trials)
    )
    ceiling = rate / per_example
    rows = [
        ("reference loop (DataLoader, Python loop over labels)", reference),
        ("gpuflow, one run", one),
        (f"gpuflow, {args.runs} runs stacked", stacked),
    ]
    if "eager" in rates:
        rows.append((f"gpuflow, {args.runs} runs stacked, no CUDA graph", rates["eager"]))
    print(f"{'method':58s} {'examples/s':>12s} {'x reference':>12s} {'% of ceiling':>13s}")
    for name, value in rows:
        print(f"{name:58s} {value:12,.0f} {value / reference:12.2f} {100 * value / ceiling:12.1f}%")
    print(f"stacked / one run: {stacked / one:.2f}x")
    if "eager" in rates:
        print(f"stacked, CUDA graph / no CUDA graph: {stacked / rates['eager']:.2f}x")
    print(
        f"FLOP-bound ceiling: {rate / 1e9:,.1f} GFLOP/s on the step's batched matmuls / "
        f"{per_example / 1e6:.1f} MFLOP per example = {ceiling:,.0f} examples/s"
    )
    print(
        "(the reference computes x W for each of the 10 classes: "
        f"{reference_flops(args.hidden, args.latent) / per_example:.2f}x gpuflow's matmul FLOPs)"
    )


def reference_flops(hidden: int, latent: int) -> float:
    """Training matmul FLOPs per example of the reference (mean of labelled and unlabelled)."""

    def bound(classes: int) -> int:
        return classes * (
            (D + K) * hidden + hidden * 2 * latent + (latent + K) * hidden + hidden * D
        )

    classify = D * hidden + hidden * K
    return 3 * 2 * ((bound(K) + classify) + (bound(1) + classify)) / 2


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
