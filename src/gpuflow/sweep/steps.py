"""`gpuflow` steps of the seed-sweep family."""

from __future__ import annotations

import argparse

from gpuflow.registry import add_settings_arguments, lazy


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the sweep steps to the `gpuflow` parser."""
    shard = subparsers.add_parser(
        "sweep-shard", help="teacher-student runs of one method/rank/width over a seed range"
    )
    shard.add_argument("--method", required=True, choices=["gd", "gnc"])
    shard.add_argument("--teacher-rank", type=int, required=True)
    shard.add_argument("--student-width", type=int, required=True)
    shard.add_argument("--seeds", required=True, help="START:STOP, STOP excluded")
    add_settings_arguments(shard, "sweep")
    shard.add_argument("--out", required=True, help="CSV, one row per seed")
    shard.add_argument("--run-out", required=True, help="JSON: devices, resumed/computed seeds")
    shard.set_defaults(run=lazy("gpuflow.sweep.shard:main", outputs=("out", "run_out")))

    aggregate = subparsers.add_parser("sweep-aggregate", help="all shards as one tidy table")
    aggregate.add_argument("--shards", nargs="+", required=True, help="shard CSVs")
    aggregate.add_argument(
        "--out", required=True, help="CSV, one row per (method, rank, width, seed)"
    )
    aggregate.add_argument("--out-summary", required=True, help="CSV of means per configuration")
    aggregate.set_defaults(run=lazy("gpuflow.sweep.aggregate:main", outputs=("out", "out_summary")))

    figures = subparsers.add_parser("sweep-figures", help="test error and guesses figures")
    figures.add_argument("--table", required=True)
    figures.add_argument("--out-test-error", required=True)
    figures.add_argument("--out-guesses", required=True)
    figures.set_defaults(
        run=lazy("gpuflow.sweep.figures:main", outputs=("out_guesses", "out_test_error"))
    )
