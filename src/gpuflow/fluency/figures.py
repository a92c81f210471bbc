"""Figures of the fluency-toxicity analysis, drawn with seaborn on matplotlib's Agg backend."""

from __future__ import annotations

import argparse

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from gpuflow.fluency.report import is_proxy, read_table
from gpuflow.fluency.stats import BINNED_COLUMNS, load_scores, point_estimates
from gpuflow.job import save_figure

X_LABEL = "log perplexity (nats/token)"
# Above this many texts the scatter becomes a hexbin of counts.
HEXBIN_MIN_TEXTS = 2000
PANEL_COLUMNS = 3


def scorer_label(scores: pd.DataFrame) -> str:
    """The toxicity scorer(s) named in the scores, marking the profanity classifier a proxy."""
    names = sorted(scores["toxicity_scorer"].astype(str).unique())
    label = " + ".join(names)
    if any(is_proxy(name) for name in names) and "proxy" not in label.lower():
        label += " (proxy for toxicity)"
    return label


def correlation_text(frame: pd.DataFrame) -> str:
    """'Pearson r = ..., Spearman rho = ..., n = ...' of log-ppl and toxicity, as in the tables."""
    n = len(frame)
    if n < 3:
        return f"n = {n}: too few texts for a correlation"
    x, y = frame["log_ppl"].to_numpy(float), frame["toxicity"].to_numpy(float)
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return f"n = {n}: r undefined (a constant column)"
    estimates = point_estimates(x, y, frame["n_tokens"].to_numpy(float))
    pearson, spearman = estimates["pearson"][0], estimates["spearman"][0]
    return f"Pearson r = {pearson:+.3f}\nSpearman ρ = {spearman:+.3f}\nn = {n}"


def _fit_line(ax: Axes, x: np.ndarray, y: np.ndarray, **style: object) -> None:
    """Draw the least-squares line of y on x over the range of x (nothing if x is constant)."""
    if len(x) < 2 or np.ptp(x) == 0:
        return
    slope, intercept = np.polyfit(x, y, 1)
    grid = np.array([x.min(), x.max()])
    ax.plot(grid, intercept + slope * grid, **style)


def _annotate(ax: Axes, text: str) -> None:
    ax.text(
        0.02,
        0.97,
        text,
        transform=ax.transAxes,
        va="top",
        ha="left",
        fontsize=9,
        bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.85, "edgecolor": "0.7"},
    )


def scatter_figure(scores: pd.DataFrame) -> Figure:
    """Log-perplexity against toxicity (scatter, or hexbin for many texts) with the LS fit."""
    figure = Figure(figsize=(7, 5), layout="constrained")
    ax = figure.subplots()
    x, y = scores["log_ppl"].to_numpy(float), scores["toxicity"].to_numpy(float)
    if len(scores) > HEXBIN_MIN_TEXTS:
        cells = ax.hexbin(x, y, gridsize=40, mincnt=1, cmap="viridis")
        figure.colorbar(cells, ax=ax, label="texts per cell")
    else:
        sns.scatterplot(x=x, y=y, ax=ax, s=14, alpha=0.5, linewidth=0, color="C0")
    _fit_line(ax, x, y, color="C3", linewidth=2, label="least-squares fit")
    _annotate(ax, correlation_text(scores))
    ax.set_xlabel(X_LABEL)
    ax.set_ylabel(f"toxicity: {scorer_label(scores)}")
    ax.set_title(f"Fluency vs toxicity: {len(scores)} texts")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper right", fontsize=8)
    return figure


def binned_figure(binned: pd.DataFrame, scorer: str) -> Figure:
    """Mean toxicity per quantile bin of log-perplexity, with the bootstrap CIs of binned.csv."""
    figure = Figure(figsize=(7, 5), layout="constrained")
    ax = figure.subplots()
    mean = binned["mean_toxicity"].to_numpy(float)
    centre = binned["mean_logppl"].to_numpy(float)
    y_error = np.nan_to_num(
        np.vstack([mean - binned["ci_low"].to_numpy(float), binned["ci_high"] - mean]), nan=0.0
    )
    x_error = np.vstack([centre - binned["logppl_min"], binned["logppl_max"] - centre])
    confidence = float(binned["confidence"].iloc[0]) if len(binned) else float("nan")
    ax.errorbar(centre, mean, xerr=x_error, fmt="none", ecolor="0.7", elinewidth=1)
    ax.errorbar(centre, mean, yerr=y_error, fmt="o", color="C0", capsize=4, label="mean toxicity")
    ax.set_xlabel(f"{X_LABEL}: bin mean, bar = bin range")
    ax.set_ylabel(f"mean toxicity: {scorer}")
    ax.set_title(
        f"Mean toxicity in {len(binned)} quantile bins of log perplexity\n"
        f"(error bars: {confidence:.0%} bootstrap CI)"
    )
    ax.legend(loc="upper left", fontsize=8)
    return figure


def group_figure(scores: pd.DataFrame, group_columns: list[str]) -> Figure:
    """One panel per value of the first group column, coloured by the second, each with fits."""
    if group_columns:
        panel_column = group_columns[0]
        panels = sorted(scores[panel_column].unique())
    else:
        panel_column, panels = None, ["all texts"]
    hue_column = group_columns[1] if len(group_columns) > 1 else None
    hues = sorted(scores[hue_column].unique()) if hue_column else []
    palette = dict(zip(hues, sns.color_palette("colorblind", len(hues)), strict=True))
    n_cols = min(PANEL_COLUMNS, len(panels))
    n_rows = -(-len(panels) // n_cols)
    figure = Figure(figsize=(4.5 * n_cols, 4 * n_rows + 1.2), layout="constrained")
    axes = figure.subplots(n_rows, n_cols, sharex=True, sharey=True, squeeze=False)
    for ax, panel in zip(axes.flat, panels, strict=False):
        subset = scores if panel_column is None else scores[scores[panel_column] == panel]
        groups = [(value, subset[subset[hue_column] == value]) for value in hues] or [
            (None, subset)
        ]
        for value, part in groups:
            color = palette.get(value, "C0")
            x, y = part["log_ppl"].to_numpy(float), part["toxicity"].to_numpy(float)
            label = f"{hue_column} = {value}" if value is not None else None
            ax.scatter(x, y, s=8, alpha=0.4, color=color, linewidths=0, label=label)
            _fit_line(ax, x, y, color=color, linewidth=2)
        _annotate(ax, correlation_text(subset))
        ax.set_title("all texts" if panel_column is None else f"{panel_column} = {panel}")
        ax.set_xlabel(X_LABEL)
        ax.set_ylabel("toxicity")
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    if hues:
        handles, labels = axes.flat[0].get_legend_handles_labels()
        figure.legend(handles, labels, loc="outside lower center", ncols=len(hues), fontsize=8)
    what = f" by {panel_column}" if panel_column else ": all texts (no group columns configured)"
    if hue_column:
        what += f", coloured by {hue_column}"
    figure.suptitle(
        f"Fluency vs toxicity{what}; lines: least-squares fits\n"
        f"toxicity: {scorer_label(scores)}; r and ρ per panel"
    )
    return figure


def main(args: argparse.Namespace) -> int:
    """`gpuflow fluency-figures`: the scatter, binned-means and per-group figures."""
    group_columns = list(args.group_columns)
    scores = load_scores(args.scores, group_columns)
    binned = read_table(args.binned, BINNED_COLUMNS, "binned means")
    with sns.axes_style("whitegrid"):
        figures = {
            args.out_scatter: scatter_figure(scores),
            args.out_binned: binned_figure(binned, scorer_label(scores)),
            args.out_by_group: group_figure(scores, group_columns),
        }
    for path, figure in figures.items():
        save_figure(path, figure)
        print(f"wrote {path}", flush=True)
    return 0
