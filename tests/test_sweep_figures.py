"""The sweep figures plot the numbers of the table, and nothing else."""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuflow.sweep.figures import error_figure, guesses_figure


def sweep_table() -> pd.DataFrame:
    """Two methods x two ranks x two widths x three seeds with distinct, known errors."""
    rows = []
    for method in ("gd", "gnc"):
        for rank in (1, 2):
            for width in (2, 4):
                for seed in range(3):
                    error = (
                        0.1 * rank + 0.01 * width + 0.001 * seed + (0.5 if method == "gnc" else 0)
                    )
                    rows.append({
                        "method": method, "teacher_rank": rank, "student_width": width,
                        "seed": seed, "test_error": error, "guesses": 10 * (seed + 1) * width,
                        "reached_threshold": seed < 2,
                    })  # fmt: skip
    return pd.DataFrame(rows)


def plotted_points(axes) -> set[tuple[float, float]]:
    """The (x, y) points of the data lines (not the dotted reference line at error 1)."""
    return {
        (round(float(x), 9), round(float(y), 9))
        for line in axes.lines
        if line.get_linestyle() != ":"
        for x, y in line.get_xydata()
        if np.isfinite(y)
    }


def test_the_error_figure_plots_the_mean_error_per_width_of_each_method_and_rank():
    table = sweep_table()
    figure = error_figure(table)
    means = table.groupby(["teacher_rank", "method", "student_width"])["test_error"].mean()
    for axes, rank in zip(figure.axes, (1, 2), strict=True):
        expected = {
            (float(width), round(float(mean), 9))
            for (r, _, width), mean in means.items()
            if r == rank
        }
        assert plotted_points(axes) == expected, rank


def test_the_guesses_figure_plots_every_gnc_seed_and_the_budget_line():
    table = sweep_table()
    figure = guesses_figure(table)
    (axes,) = figure.axes
    plotted = sorted(
        float(y) for collection in axes.collections for _, y in collection.get_offsets()
    )
    gnc = table[table["method"] == "gnc"]
    assert plotted == sorted(gnc["guesses"].astype(float))
    budget = [line.get_ydata()[0] for line in axes.lines if line.get_linestyle() == ":"]
    assert budget == [gnc.loc[~gnc["reached_threshold"], "guesses"].max()]
