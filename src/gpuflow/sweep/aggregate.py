"""`gpuflow sweep-aggregate`: every shard's rows as one tidy table, and a summary per cell."""

from __future__ import annotations

import argparse

import pandas as pd

from gpuflow.errors import DataError
from gpuflow.job import write_csv
from gpuflow.sweep.columns import COLUMNS

KEYS = ["method", "teacher_rank", "student_width"]


def read_shards(paths: list[str]) -> pd.DataFrame:
    """All shard tables, checked for their columns and for duplicate seeds, in a stable order."""
    frames = []
    for path in paths:
        frame = pd.read_csv(path)
        missing = [c for c in COLUMNS if c not in frame.columns]
        if missing:
            raise DataError(path, f"missing columns {missing}", expected=f"columns {COLUMNS}")
        frames.append(frame[COLUMNS])
    table = pd.concat(frames, ignore_index=True)
    duplicated = table.duplicated([*KEYS, "seed"])
    if duplicated.any():
        first = table[duplicated].iloc[0]
        raise DataError(paths[0], f"seed {first['seed']} of {dict(first[KEYS])} appears twice")
    return table.sort_values([*KEYS, "seed"], ignore_index=True)


def summarise(table: pd.DataFrame) -> pd.DataFrame:
    """Per (method, rank, width): seeds, success rate, mean and median errors, steps, guesses."""
    grouped = table.groupby(KEYS, sort=True)
    summary = grouped.agg(
        n_seeds=("seed", "size"),
        success_rate=("reached_threshold", "mean"),
        train_error_mean=("train_error", "mean"),
        test_error_mean=("test_error", "mean"),
        test_error_sem=("test_error", "sem"),
        test_error_median=("test_error", "median"),
        steps_median=("steps", "median"),
        guesses_median=("guesses", "median"),
        wall_s_mean=("wall_s", "mean"),
    )
    return summary.reset_index()


def main(args: argparse.Namespace) -> int:
    """Write the tidy table and its summary."""
    table = read_shards(args.shards)
    write_csv(args.out, table)
    write_csv(args.out_summary, summarise(table))
    print(f"{len(table)} runs from {len(args.shards)} shards -> {args.out}")
    return 0
