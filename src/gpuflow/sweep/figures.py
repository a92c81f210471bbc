"""`gpuflow sweep-figures`: test error vs student width (GD vs G&C), and guesses needed."""

from __future__ import annotations

import argparse

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns
from matplotlib.ticker import NullFormatter

from gpuflow.job import save_figure

LABELS = {"gd": "gradient descent", "gnc": "guess & check"}


def error_figure(table: pd.DataFrame) -> plt.Figure:
    """One panel per teacher rank: test error (mean and 95% CI over seeds) vs student width."""
    frame = table.assign(method=table["method"].map(LABELS))
    grid = sns.relplot(
        data=frame,
        x="student_width",
        y="test_error",
        hue="method",
        col="teacher_rank",
        kind="line",
        marker="o",
        errorbar=("ci", 95),
        height=3,
        aspect=1.1,
    )
    widths = sorted(frame["student_width"].unique())
    grid.set(xlabel="student width d", ylabel="test error (relative)")
    for ax in grid.axes.flat:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks(widths, [str(w) for w in widths])
        ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    grid.set_titles("teacher rank {col_name}")
    return grid.figure


def guesses_figure(table: pd.DataFrame) -> plt.Figure:
    """Guesses G&C needed per seed, by width and rank (runs that spent the budget sit on it)."""
    frame = table[table["method"] == "gnc"].astype({"teacher_rank": str})
    figure, ax = plt.subplots(figsize=(6, 3.5))
    if frame.empty:
        ax.text(0.5, 0.5, "no guess-and-check runs", ha="center", transform=ax.transAxes)
        return figure
    sns.stripplot(
        data=frame,
        x="student_width",
        y="guesses",
        hue="teacher_rank",
        dodge=True,
        palette="viridis",
        alpha=0.7,
        ax=ax,
    )
    ax.set(yscale="log", xlabel="student width d", ylabel="guesses needed")
    ax.legend(title="teacher rank", fontsize=8)
    budget = frame.loc[~frame["reached_threshold"], "guesses"]
    if not budget.empty:
        ax.axhline(budget.max(), color="grey", lw=0.8, ls=":", label="budget")
    return figure


def main(args: argparse.Namespace) -> int:
    """Draw both figures from the tidy table."""
    table = pd.read_csv(args.table)
    save_figure(args.out_test_error, error_figure(table))
    save_figure(args.out_guesses, guesses_figure(table))
    return 0
