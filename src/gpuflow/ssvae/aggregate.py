"""One tidy row per run (M2 and baseline), the mean, std and 95% CI over seeds, and the curves."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from gpuflow.errors import DataError
from gpuflow.job import write_csv

GRID = ["model", "frac", "n_labelled", "corrupt", "alpha"]
PAIR = ["frac", "corrupt", "seed"]
CURVE = ("test_accuracy", "val_accuracy")


def read_metrics(path: str | Path) -> dict[str, Any]:
    """One run's metrics.json (DataError when it does not read back)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise DataError(path, f"unreadable metrics: {error}") from error


def selection(curve: list[dict[str, Any]]) -> dict[str, Any]:
    """The epoch of best validation accuracy and the test accuracy there."""
    evaluated = [point for point in curve if "val_accuracy" in point]
    if not evaluated:
        return {}
    best = max(evaluated, key=lambda point: (point["val_accuracy"], -point["epoch"]))
    return {
        "best_val_epoch": best["epoch"],
        "best_val_accuracy": best["val_accuracy"],
        "selected_test_accuracy": best["test_accuracy"],
        "selected_test_error": 1.0 - best["test_accuracy"],
    }


def run_row(path: str | Path, metrics: dict[str, Any]) -> dict[str, Any]:
    """The flat row of one run's metrics (read from `path`)."""
    timing = metrics["timing"]
    row = {key: metrics[key] for key in ("model", "frac", "corrupt", "alpha", "seed")}
    row.update({key: metrics[key] for key in ("n_train", "n_labelled", "n_corrupted", "epochs")})
    row.update(test_accuracy=metrics["test_accuracy"], test_error=metrics["test_error"])
    row.update({f"test_{k}": v for k, v in metrics["test_elbo"].items()})
    row.update(selection(metrics["curve"]))
    row.update(
        train_time_s=timing["train_time_s"],
        samples_per_s=timing["samples_per_s"],
        stack_size=timing["stack_size"],
        devices=" ".join(metrics["run_record"]["devices"]),
        path=str(path),
    )
    return row


def tidy_curves(metrics: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """One row per evaluated epoch of all runs (by path): test (and validation) accuracy."""
    rows = []
    for run in metrics.values():
        ids = {key: run[key] for key in ("model", "frac", "n_labelled", "corrupt", "alpha", "seed")}
        rows += [
            {**ids, "epoch": point["epoch"], **{k: point[k] for k in CURVE if k in point}}
            for point in run["curve"]
            if "test_accuracy" in point
        ]
    return pd.DataFrame(rows)


def tidy_runs(metrics: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """All runs, with each M2 run's paired baseline accuracy."""
    runs = pd.DataFrame([run_row(path, run) for path, run in metrics.items()])
    baseline = runs.loc[runs["model"] == "baseline", [*PAIR, "test_accuracy"]].rename(
        columns={"test_accuracy": "baseline_accuracy"}
    )
    runs = runs.merge(baseline, on=PAIR, how="left")
    runs["gain_over_baseline"] = runs["test_accuracy"] - runs["baseline_accuracy"]
    runs.loc[runs["model"] == "baseline", ["baseline_accuracy", "gain_over_baseline"]] = np.nan
    return runs.sort_values(["model", "frac", "corrupt", "alpha", "seed"]).reset_index(drop=True)


def ci95(values: pd.Series) -> float:
    """Half-width of the 95% t-interval of the mean (NaN for fewer than two values)."""
    values = values.dropna()
    if len(values) < 2:
        return float("nan")
    return float(stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values)))


def summarise(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean, std and 95% CI over seeds of accuracy, error and gain per grid point."""
    grouped = runs.groupby(GRID, dropna=False)
    columns = {
        "n_seeds": ("seed", "nunique"),
        "accuracy_mean": ("test_accuracy", "mean"),
        "accuracy_std": ("test_accuracy", "std"),
        "accuracy_ci95": ("test_accuracy", ci95),
        "error_mean": ("test_error", "mean"),
        "error_std": ("test_error", "std"),
        "gain_mean": ("gain_over_baseline", "mean"),
        "gain_ci95": ("gain_over_baseline", ci95),
        "samples_per_s_mean": ("samples_per_s", "mean"),
    }
    if "selected_test_error" in runs:
        columns.update(
            selected_error_mean=("selected_test_error", "mean"),
            selected_error_std=("selected_test_error", "std"),
            best_val_epoch_min=("best_val_epoch", "min"),
            best_val_epoch_max=("best_val_epoch", "max"),
        )
    return grouped.agg(**columns).reset_index()


def main(args: argparse.Namespace) -> None:
    """`gpuflow ssvae-aggregate`."""
    metrics = {path: read_metrics(path) for path in args.metrics}
    runs = tidy_runs(metrics)
    write_csv(args.out_runs, runs)
    write_csv(args.out_summary, summarise(runs))
    if args.out_curves:
        write_csv(args.out_curves, tidy_curves(metrics))
    print(f"{len(runs)} runs -> {args.out_runs}, {args.out_summary}")
