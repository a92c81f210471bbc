"""One teacher-student run: a rank-r linear teacher, a two-layer linear student of width d."""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass
from typing import Any

import torch

METHODS = ("gd", "gnc")


@dataclass(frozen=True)
class Problem:
    """A teacher and its training data on one device."""

    teacher: torch.Tensor  # output_dim x input_dim
    inputs: torch.Tensor  # input_dim x n_train
    labels: torch.Tensor  # output_dim x n_train


def stable_seed(*parts: object) -> int:
    """A 63-bit seed from any printable parts, the same in every process and Python version."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def make_problem(data: dict[str, Any], rank: int, seed: int, device: torch.device) -> Problem:
    """The teacher of `rank` and its training set for `seed` (drawn on the CPU, then moved)."""
    generator = torch.Generator().manual_seed(stable_seed("teacher", data["seed"], rank, seed))
    m, dim, n = data["output_dim"], data["input_dim"], data["n_train"]
    left = torch.randn(m, rank, generator=generator)  # drawn first, then the right factor
    product = left @ torch.randn(rank, dim, generator=generator)
    teacher = product / product.norm()
    inputs = torch.randn(dim, n, generator=generator)
    noise = torch.randn(m, n, generator=generator)
    labels = teacher @ inputs + data["label_noise"] * noise
    return Problem(teacher.to(device), inputs.to(device), labels.to(device))


def draw_weights(
    shape_batch: tuple[int, ...], width: int, problem: Problem, scale: float, generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """W1, W2 from the initialisation distribution: scale * N(0, 1/fan_in) entries."""
    m, dim = problem.teacher.shape
    device = problem.inputs.device
    w1 = torch.randn(*shape_batch, width, dim, generator=generator, device=device)
    w2 = torch.randn(*shape_batch, m, width, generator=generator, device=device)
    return w1 * (scale / math.sqrt(dim)), w2 * (scale / math.sqrt(width))


def population_error(product: torch.Tensor, teacher: torch.Tensor) -> float:
    """Population error of the end-to-end map against the noise-free teacher, relative."""
    return float((product - teacher).pow(2).sum() / teacher.pow(2).sum())


def gradient_descent(
    problem: Problem, width: int, settings: dict[str, Any], generator
) -> dict[str, Any]:
    """Full-batch GD from small initialisation until train error < threshold or max_steps."""
    x, y = problem.inputs, problem.labels
    w1, w2 = draw_weights((), width, problem, settings["init_scale"], generator)
    y_norm = y.pow(2).sum()
    curvature = 2 * torch.linalg.eigvalsh(x @ x.T)[-1] / y_norm
    step = settings["lr"] / float(curvature)
    threshold, steps = settings["loss_threshold"], 0
    while True:
        residual = w2 @ (w1 @ x) - y
        train = float(residual.pow(2).sum() / y_norm)
        if train < threshold or steps >= settings["max_steps"] or not math.isfinite(train):
            break
        grad_product = (2 / y_norm) * (residual @ x.T)
        w1, w2 = w1 - step * (w2.T @ grad_product), w2 - step * (grad_product @ w1.T)
        steps += 1
    return {
        "reached_threshold": train < threshold,
        "train_error": train,
        "test_error": population_error(w2 @ w1, problem.teacher),
        "steps": steps,
        "guesses": None,
    }


def guess_and_check(
    problem: Problem, width: int, settings: dict[str, Any], generator
) -> dict[str, Any]:
    """Draw students in batches until one has train error < threshold, or the budget is spent."""
    x, y = problem.inputs, problem.labels
    y_norm = y.pow(2).sum()
    budget, batch = settings["max_guesses"], settings["batch_size"]
    threshold = settings["loss_threshold"]
    best: tuple[float, int, torch.Tensor] | None = None
    drawn = 0
    while drawn < budget:
        size = min(batch, budget - drawn)
        w1, w2 = draw_weights((size,), width, problem, 1.0, generator)
        predictions = w2 @ (w1 @ x)
        overlap = (predictions * y).sum(dim=(1, 2))
        power = predictions.pow(2).sum(dim=(1, 2)).clamp_min(torch.finfo(x.dtype).tiny)
        errors = 1 - overlap.pow(2) / (power * y_norm)
        hits = torch.nonzero(errors < threshold)
        index = int(hits[0, 0]) if len(hits) else int(errors.argmin())
        if best is None or len(hits) or float(errors[index]) < best[0]:
            scale = overlap[index] / power[index]
            best = (float(errors[index]), drawn + index + 1, scale * (w2[index] @ w1[index]))
        if len(hits):
            break
        drawn += size
    assert best is not None
    train, guesses, product = best
    reached = train < threshold
    return {
        "reached_threshold": reached,
        "train_error": train,
        "test_error": population_error(product, problem.teacher),
        "steps": None,
        "guesses": guesses if reached else budget,
    }


def run_seed(settings: dict[str, Any], seed: int, device: torch.device) -> dict[str, Any]:
    """One run of settings['method'] for one seed: a tidy row (wall time included)."""
    method, rank, width = settings["method"], settings["teacher_rank"], settings["student_width"]
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}, expected one of {METHODS}")
    start = time.perf_counter()
    problem = make_problem(settings["data"], rank, seed, device)
    key = stable_seed("student", method, settings["data"]["seed"], rank, width, seed)
    generator = torch.Generator(device=device).manual_seed(key)  # the student's init or guesses
    solve = gradient_descent if method == "gd" else guess_and_check
    result = solve(problem, width, settings[method], generator)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    data = settings["data"]
    return {
        "method": method,
        "teacher_rank": rank,
        "student_width": width,
        "seed": seed,
        **result,
        "loss_threshold": settings[method]["loss_threshold"],
        **{name: data[name] for name in ("n_train", "input_dim", "output_dim", "label_noise")},
        "wall_s": time.perf_counter() - start,
    }
