"""`gpuflow scaling-figures`: the scaling figures, one panel per configuration."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from gpuflow.job import save_figure

DDP = "transformer-ddp"


def run_label(world_size: int, nodes: int, device_type: str) -> str:
    """'2 GPUs' (or '2 CPU proc.') style label; multi-node runs say so."""
    unit = "GPU" if device_type == "cuda" else "CPU proc."
    plural = "s" if world_size > 1 and unit == "GPU" else ""
    return f"{world_size} {unit}{plural}" + (f", {nodes} nodes" if nodes > 1 else "")


def runs_of(runs: pd.DataFrame, name: str) -> tuple[pd.DataFrame, np.ndarray, list[str]]:
    """Configuration `name`'s runs by nodes and world size, their bar positions and labels."""
    group = runs[runs["configuration"] == name].sort_values(["nodes", "world_size"])
    columns = zip(group["world_size"], group["nodes"], group["device_type"], strict=True)
    return group, np.arange(len(group)), [run_label(w, n, d) for w, n, d in columns]


def epoch_lines(
    ax: Axes, epochs: pd.DataFrame, name: str, column: str, scale: float, warmup: bool = False
) -> None:
    """`scale` x `column` per epoch, one line per run of `name`; warm-up epochs hollow if asked."""
    for (world, nodes, device), run in epochs[epochs["configuration"] == name].groupby(
        ["world_size", "nodes", "device_type"]
    ):
        line = ax.plot(
            run["epoch"], scale * run[column], marker="o", label=run_label(world, nodes, device)
        )
        if warmup:
            warm = run[~run["measured"]]
            ax.plot(
                warm["epoch"], scale * warm[column], "o", mfc="white", color=line[0].get_color()
            )
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def panels(configurations: list[str], draw: Callable[[Axes, str], None]) -> Figure:
    """One panel per configuration, side by side, each with its legend."""
    figure, axes = plt.subplots(
        1, len(configurations), figsize=(4.6 * len(configurations), 3.6), squeeze=False
    )
    for ax, name in zip(axes[0], configurations, strict=True):
        draw(ax, name)
        ax.legend(fontsize=8)
        ax.set_title(name)
        ax.grid(alpha=0.3)
    figure.tight_layout()
    return figure


def epoch_time_figure(epochs: pd.DataFrame, configurations: list[str]) -> Figure:
    """Training time of every epoch; warm-up epochs drawn hollow."""

    def draw(ax: Axes, name: str) -> None:
        epoch_lines(ax, epochs, name, "train_seconds", 1, warmup=True)
        ax.set_xlabel("epoch (hollow = warm-up, not in means)")
        ax.set_ylabel("training time per epoch (s)")

    return panels(configurations, draw)


def speedup_figure(runs: pd.DataFrame, configurations: list[str]) -> Figure:
    """Speedup (top) and efficiency (bottom) against ideal linear scaling."""
    figure, axes = plt.subplots(
        2, len(configurations), figsize=(4.6 * len(configurations), 6.4), squeeze=False
    )
    for column, name in enumerate(configurations):
        group, x, labels = runs_of(runs, name)
        ideal = group["world_size"] / group["reference_world_size"]
        top, bottom = axes[0][column], axes[1][column]
        top.bar(x, group["speedup"], color="tab:blue", label="measured")
        top.plot(x, ideal, "k--", marker="_", label="ideal")
        top.set_ylabel("speedup")
        top.set_title(name)
        top.legend(fontsize=8)
        bottom.bar(x, 100 * group["efficiency"], color="tab:orange")
        bottom.axhline(100, color="k", linestyle="--", label="ideal")
        bottom.set_ylabel("efficiency (%)")
        for ax in (top, bottom):
            ax.set_xticks(x, labels, fontsize=8)
            ax.grid(alpha=0.3, axis="y")
    figure.tight_layout()
    return figure


def throughput_figure(runs: pd.DataFrame, configurations: list[str]) -> Figure:
    """Training samples per second at each world size, with linear scaling from the reference."""

    def draw(ax: Axes, name: str) -> None:
        group, x, labels = runs_of(runs, name)
        base = group[group["world_size"] == group["reference_world_size"]]["samples_per_second"]
        ideal = base.iloc[0] * group["world_size"] / group["reference_world_size"]
        ax.bar(x, group["samples_per_second"], color="tab:green", label="measured")
        ax.plot(x, ideal, "k--", marker="_", label="linear")
        ax.set_xticks(x, labels, fontsize=8)
        ax.set_ylabel("training samples / s")

    return panels(configurations, draw)


def accuracy_figure(
    epochs: pd.DataFrame, baselines: pd.DataFrame, configurations: list[str]
) -> Figure:
    """Validation accuracy per epoch; the CPU baseline as a dashed line."""

    def draw(ax: Axes, name: str) -> None:
        epoch_lines(ax, epochs, name, "val_accuracy", 100)
        for _, row in baselines[baselines["configuration"] == name].iterrows():
            ax.axhline(100 * row["final_val_accuracy"], color="gray", linestyle="--",
                       label=f"{row['method']} (CPU)")  # fmt: skip
        ax.set_xlabel("epoch")
        ax.set_ylabel("validation accuracy (%)")

    return panels(configurations, draw)


def comm_figure(runs: pd.DataFrame, configurations: list[str]) -> Figure:
    """Milliseconds per optimizer step: compute plus exposed all-reduce, beside the total."""

    def draw(ax: Axes, name: str) -> None:
        group, x, labels = runs_of(runs, name)
        left, right = x - 0.2, x + 0.2
        ax.bar(left, group["compute_ms_per_step"], width=0.4, color="tab:blue", label="compute")
        ax.bar(left, group["comm_exposed_ms_per_step"], width=0.4,
               bottom=group["compute_ms_per_step"], color="tab:red",
               label="exposed all-reduce")  # fmt: skip
        ax.bar(right, group["comm_total_ms_per_step"], width=0.4, color="white",
               edgecolor="tab:red", hatch="//", label="total all-reduce")  # fmt: skip
        step = group["compute_ms_per_step"] + group["comm_exposed_ms_per_step"]
        for xi, height, share in zip(left, step, group["comm_exposed_share"], strict=True):
            ax.annotate(
                f"{100 * share:.0f}% exposed", (xi, height), ha="center", va="bottom", fontsize=8
            )
        ax.set_xticks(x, labels, fontsize=8)
        ax.set_ylabel("ms per optimizer step")

    return panels(configurations, draw)


def main(args: argparse.Namespace) -> None:
    """Draw the five figures from the summary and epoch tables."""
    summary = pd.read_csv(args.summary)
    epochs = pd.read_csv(args.epochs)
    runs = summary[summary["method"] == DDP]
    baselines = summary[summary["method"] != DDP]
    configurations = list(dict.fromkeys(runs["configuration"]))
    for path, figure in (
        (args.out_epoch_time, epoch_time_figure(epochs, configurations)),
        (args.out_speedup, speedup_figure(runs, configurations)),
        (args.out_throughput, throughput_figure(runs, configurations)),
        (args.out_accuracy, accuracy_figure(epochs, baselines, configurations)),
        (args.out_comm, comm_figure(runs, configurations)),
    ):
        save_figure(path, figure)
        plt.close(figure)
