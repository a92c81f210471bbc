"""`gpuflow` steps of the DDP scaling family."""

from __future__ import annotations

import argparse

from gpuflow.registry import add_settings_arguments, lazy


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the scaling steps to the `gpuflow` parser."""
    data = subparsers.add_parser("scaling-data", help="training and validation splits")
    data.add_argument("--name", required=True, help="configuration name")
    add_settings_arguments(data, "scaling")
    data.add_argument("--out-train", required=True, help="CSV: text, label")
    data.add_argument("--out-val", required=True, help="CSV: text, label")
    data.add_argument("--out-info", required=True, help="JSON: counts and label names")
    data.set_defaults(
        run=lazy("gpuflow.scaling.data:main", outputs=("out_info", "out_train", "out_val"))
    )

    tok = subparsers.add_parser("scaling-tokenize", help="learn a BPE tokenizer, encode splits")
    tok.add_argument("--train", required=True)
    tok.add_argument("--val", required=True)
    tok.add_argument("--name", required=True, help="configuration name")
    add_settings_arguments(tok, "scaling")
    tok.add_argument("--out-tokenizer", required=True, help="tokenizer.json")
    tok.add_argument("--out-train", required=True, help="encoded training split (.npz)")
    tok.add_argument("--out-val", required=True, help="encoded validation split (.npz)")
    tok.add_argument("--out-stats", required=True, help="JSON: vocabulary and token counts")
    tok.set_defaults(
        run=lazy(
            "gpuflow.scaling.tokens:main",
            outputs=("out_stats", "out_tokenizer", "out_train", "out_val"),
        )
    )

    train = subparsers.add_parser(
        "scaling-train", help="DDP training run (start with torchrun for more than one process)"
    )
    train.add_argument("--name", required=True, help="configuration name")
    train.add_argument("--train", required=True, help="encoded training split")
    train.add_argument("--val", required=True, help="encoded validation split")
    train.add_argument("--data-info", required=True, help="JSON from scaling-data")
    train.add_argument("--token-stats", required=True, help="JSON from scaling-tokenize")
    add_settings_arguments(train, "scaling")
    train.add_argument(
        "--cpu-slots", type=int, default=1, help="CPU processes the cores are shared by"
    )
    train.add_argument(
        "--nccl",
        default="{}",
        help="JSON: NCCL_* settings each process sets before NCCL starts, where the environment"
        " sets none (the SLURM site file's `nccl` block)",
    )
    train.add_argument("--out-json", required=True, help="run record with every epoch")
    train.add_argument("--out-model", required=True, help="final weights (state dict)")
    train.set_defaults(run=lazy("gpuflow.scaling.train:main", outputs=("out_json", "out_model")))

    base = subparsers.add_parser("scaling-baseline", help="TF-IDF + scikit-learn classifier")
    base.add_argument("--name", required=True, help="configuration name")
    base.add_argument("--train", required=True)
    base.add_argument("--val", required=True)
    add_settings_arguments(base, "scaling")
    base.add_argument("--threads", type=int, default=1)
    base.add_argument("--out", required=True, help="JSON: accuracy and times")
    base.set_defaults(run=lazy("gpuflow.scaling.baseline:main", outputs=("out",)))

    summary = subparsers.add_parser("scaling-summary", help="tables from all runs")
    summary.add_argument("--runs", nargs="+", required=True, help="run JSONs")
    summary.add_argument("--baselines", nargs="*", default=[], help="baseline JSONs")
    summary.add_argument("--out-summary", required=True, help="comprehensive_summary.csv")
    summary.add_argument("--out-epochs", required=True, help="one row per run and epoch")
    summary.add_argument("--out-cost", required=True, help="GPU-hours and speedup per GPU-hour")
    summary.add_argument("--out-tex", required=True, help="booktabs LaTeX table")
    summary.set_defaults(
        run=lazy(
            "gpuflow.scaling.summary:main",
            outputs=("out_cost", "out_epochs", "out_summary", "out_tex"),
        )
    )

    figures = subparsers.add_parser("scaling-figures", help="the scaling figures")
    figures.add_argument("--summary", required=True)
    figures.add_argument("--epochs", required=True)
    for figure in ("epoch-time", "speedup", "throughput", "accuracy", "comm"):
        figures.add_argument(f"--out-{figure}", required=True)
    figures.set_defaults(
        run=lazy(
            "gpuflow.scaling.figures:main",
            outputs=("out_accuracy", "out_comm", "out_epoch_time", "out_speedup", "out_throughput"),
        )
    )

    report = subparsers.add_parser("scaling-report", help="diagnosis and recommendations")
    report.add_argument("--summary", required=True)
    report.add_argument("--cost", required=True)
    add_settings_arguments(report, "scaling")
    report.add_argument("--out", required=True, help="performance_report.txt")
    report.set_defaults(run=lazy("gpuflow.scaling.report:main", outputs=("out",)))
