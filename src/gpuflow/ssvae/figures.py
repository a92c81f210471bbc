"""Figures of the SSVAE grid, drawn from runs.csv only."""

from __future__ import annotations

import argparse

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from gpuflow.job import save_figure
from gpuflow.ssvae.aggregate import summarise


def _bands(ax, at: pd.DataFrame, x: str) -> None:
    """Accuracy (mean, 95% CI) against `x`: a line per M2 alpha, then the baseline dashed."""
    lines = [(f"M2 alpha={a:g}", rows, {}) for a, rows in at[at["model"] == "m2"].groupby("alpha")]
    lines.append(("baseline", at[at["model"] == "baseline"], {"color": "black", "linestyle": "--"}))
    for label, frame, style in lines:
        frame = frame.sort_values(x)
        mean, ci = frame["accuracy_mean"], frame["accuracy_ci95"].fillna(0.0)
        line = ax.plot(frame[x], mean, marker="o", label=label, **style)[0]
        ax.fill_between(frame[x], mean - ci, mean + ci, color=line.get_color(), alpha=0.2)


def _panels(
    frame: pd.DataFrame, by: str, width: float = 4.5
) -> tuple[plt.Figure, np.ndarray, list]:
    """One panel per value of column `by`, side by side: the figure, its axes and the values."""
    values = sorted(frame[by].unique())
    n = len(values)
    fig, axes = plt.subplots(1, n, figsize=(width * n, 3.8), squeeze=False, sharey=True)
    return fig, axes[0], values


def accuracy_vs_fraction(summary: pd.DataFrame) -> plt.Figure:
    """Accuracy against label fraction, one line per alpha (mean, 95% CI), baseline dashed."""
    fig, axes, rates = _panels(summary, "corrupt")
    for ax, rate in zip(axes, rates, strict=True):
        _bands(ax, summary[summary["corrupt"] == rate], "frac")
        ax.set(xscale="log", xlabel="label fraction", title=f"label corruption {rate:g}")
    axes[0].set_ylabel("test accuracy")
    axes[-1].legend(fontsize=8)
    return fig


def heatmap(summary: pd.DataFrame) -> plt.Figure:
    """Mean M2 accuracy over alpha x label fraction, one panel per corruption rate."""
    m2 = summary[summary["model"] == "m2"]
    fig, axes, rates = _panels(m2, "corrupt")
    for ax, rate in zip(axes, rates, strict=True):
        table = m2[m2["corrupt"] == rate].pivot(
            index="alpha", columns="frac", values="accuracy_mean"
        )
        image = ax.imshow(table.to_numpy(), cmap="viridis", aspect="auto", origin="lower")
        ax.set_xticks(range(len(table.columns)), [f"{f:g}" for f in table.columns])
        ax.set_yticks(range(len(table.index)), [f"{a:g}" for a in table.index])
        middle = np.nanmean(table.to_numpy())
        for (i, j), value in np.ndenumerate(table.to_numpy()):
            color = "black" if value > middle else "white"
            ax.text(j, i, f"{value:.3f}", ha="center", va="center", color=color, fontsize=8)
        ax.set(xlabel="label fraction", title=f"label corruption {rate:g}")
        fig.colorbar(image, ax=ax, label="mean test accuracy")
    axes[0].set_ylabel("alpha")
    return fig


def corruption_effect(summary: pd.DataFrame) -> plt.Figure:
    """Accuracy against corruption rate, one panel per label fraction."""
    fig, axes, fractions = _panels(summary, "frac", width=3.8)
    for ax, frac in zip(axes, fractions, strict=True):
        at = summary[summary["frac"] == frac]
        _bands(ax, at, "corrupt")
        n_labelled = int(at["n_labelled"].iloc[0])
        ax.set(xlabel="label corruption rate", title=f"fraction {frac:g} ({n_labelled} labels)")
    axes[0].set_ylabel("test accuracy")
    axes[-1].legend(fontsize=8)
    return fig


def m2_vs_baseline(runs: pd.DataFrame) -> plt.Figure:
    """M2 minus baseline accuracy per seed (same labelled subset), by fraction and alpha."""
    m2 = runs[runs["model"] == "m2"]
    alphas = sorted(m2["alpha"].unique())
    fractions = sorted(m2["frac"].unique())
    fig, axes, rates = _panels(m2, "corrupt")
    width = 0.8 / len(alphas)
    for ax, rate in zip(axes, rates, strict=True):
        for k, alpha in enumerate(alphas):
            for i, frac in enumerate(fractions):
                gains = m2[(m2["corrupt"] == rate) & (m2["alpha"] == alpha) & (m2["frac"] == frac)]
                x = i + (k - (len(alphas) - 1) / 2) * width
                ax.scatter(np.full(len(gains), x), gains["gain_over_baseline"], s=12, color=f"C{k}")
                ax.plot(
                    [x - width / 2, x + width / 2],
                    [gains["gain_over_baseline"].mean()] * 2,
                    color=f"C{k}",
                    label=f"alpha={alpha:g}" if i == 0 else None,
                )
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(fractions)), [f"{f:g}" for f in fractions])
        ax.set(xlabel="label fraction", title=f"label corruption {rate:g}")
    axes[0].set_ylabel("M2 - baseline test accuracy")
    axes[-1].legend(fontsize=8)
    return fig


def main(args: argparse.Namespace) -> None:
    """`gpuflow ssvae-figures`."""
    runs = pd.read_csv(args.runs)
    summary = summarise(runs)
    for path, figure in (
        (args.out_fraction, accuracy_vs_fraction(summary)),
        (args.out_heatmap, heatmap(summary)),
        (args.out_corruption, corruption_effect(summary)),
        (args.out_baseline, m2_vs_baseline(runs)),
    ):
        figure.tight_layout()
        save_figure(path, figure)
        plt.close(figure)
        print(f"wrote {path}")
