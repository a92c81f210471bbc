"""`gpuflow scaling-summary`: tidy tables from the run records."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pandas as pd

from gpuflow.errors import DataError
from gpuflow.job import write_csv, write_text

EPOCH_COLUMNS = [
    "epoch", "measured", "after_resume", "train_seconds", "val_seconds", "samples",
    "tokens", "samples_per_second", "tokens_per_second", "train_loss", "val_loss",
    "val_accuracy", "cpu_seconds_per_process", "peak_memory_mb", "comm_probe_steps",
    "sync_step_ms", "no_sync_step_ms", "comm_exposed_ms", "comm_total_ms", "skipped_steps",
    "loss_scale",
]  # fmt: skip
# What `run_row` reads of each epoch (the epochs table shows the others where they are).
SUMMARISED_EPOCH_FIELDS = [
    "measured", "train_seconds", "val_seconds", "samples_per_second", "tokens_per_second",
    "cpu_seconds_per_process", "comm_exposed_ms", "comm_total_ms", "comm_probe_steps",
    "val_accuracy", "peak_memory_mb",
]  # fmt: skip
RUN_RECORD_FIELDS = ["host", "slurm_job_id"]  # what `run_row` reads of where the run ran
# the columns the epochs and cost tables open with: which run a row is of
RUN_ID = ["configuration", "world_size", "nodes", "device_type"]
RUN_COLUMNS = [
    "configuration", "world_size", "nodes", "processes_per_node", "device_type", "backend",
    "precision", "global_batch_size", "per_gpu_batch_size", "accumulation_steps",
    "steps_per_epoch", "parameters", "token_embedding_parameters", "allreduce_mb_per_step",
    "torch_threads_per_process", "skipped_steps",
]  # fmt: skip


def read_runs(paths: list[str]) -> list[dict[str, Any]]:
    """Run records written by `scaling-train`, each checked for every field the tables read."""
    runs = []
    for path in paths:
        run = json.loads(Path(path).read_text())
        if not run.get("epochs"):
            raise DataError(path, "no epochs recorded", expected="a finished scaling-train run")
        missing = [c for c in RUN_COLUMNS if c not in run]
        missing += [
            f"run_record.{c}" for c in RUN_RECORD_FIELDS if c not in run.get("run_record", {})
        ]
        missing += sorted({c for e in run["epochs"] for c in SUMMARISED_EPOCH_FIELDS if c not in e})
        if missing:
            raise DataError(
                path,
                f"a run record without {', '.join(missing)}, as an older gpuflow wrote them",
                expected="a record of this gpuflow: redo the run with "
                "`snakemake --forcerun scaling_train ...`",
            )
        runs.append(run)
    return runs


def epochs_table(runs: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per run and epoch."""
    rows = [
        {**{c: run[c] for c in RUN_ID}, **{c: epoch.get(c) for c in EPOCH_COLUMNS}}
        for run in runs
        for epoch in run["epochs"]
    ]
    return pd.DataFrame(rows)


def run_row(run: dict[str, Any]) -> dict[str, Any]:
    """The summary row of one run: means over its measured epochs."""
    epochs = pd.DataFrame(run["epochs"])
    measured = epochs[epochs["measured"]] if epochs["measured"].any() else epochs
    steps = run["steps_per_epoch"]
    epoch_seconds = measured["train_seconds"].mean()
    exposed_ms = measured["comm_exposed_ms"].mean()
    total_ms = measured["comm_total_ms"].mean()
    exposed, total = exposed_ms * steps / 1000, total_ms * steps / 1000
    wall = float((epochs["train_seconds"] + epochs["val_seconds"]).sum())
    return {
        **{c: run[c] for c in RUN_COLUMNS},
        "method": "transformer-ddp",
        "epochs": len(epochs),
        "measured_epochs": len(measured),
        "epoch_seconds": epoch_seconds,
        "epoch_seconds_std": measured["train_seconds"].std(ddof=0),
        "samples_per_second": measured["samples_per_second"].mean(),
        "tokens_per_second": measured["tokens_per_second"].mean(),
        "comm_exposed_seconds_per_epoch": exposed,
        "comm_total_seconds_per_epoch": total,
        "cpu_utilisation": (
            measured["cpu_seconds_per_process"]
            / (measured["train_seconds"] - measured["comm_exposed_ms"] * steps / 1000)
        ).mean()
        / run["torch_threads_per_process"],
        "comm_exposed_share": exposed / epoch_seconds,
        "comm_total_share": total / epoch_seconds,
        "compute_ms_per_step": 1000 * epoch_seconds / steps - exposed_ms,
        "comm_exposed_ms_per_step": exposed_ms,
        "comm_total_ms_per_step": total_ms,
        "comm_probe_steps": int(measured["comm_probe_steps"].min()),
        "final_val_accuracy": epochs["val_accuracy"].iloc[-1],
        "best_val_accuracy": epochs["val_accuracy"].max(),
        "peak_memory_mb": epochs["peak_memory_mb"].max(),
        "run_wall_seconds": wall,
        "gpu_hours": run["world_size"] * wall / 3600,
        "host": run["run_record"]["host"],
        "slurm_job_id": run["run_record"]["slurm_job_id"],
    }


def add_speedup(table: pd.DataFrame) -> pd.DataFrame:
    """Speedup and efficiency of each run against its configuration's reference run."""
    table = table.copy()
    for _, group in table.groupby("configuration"):
        single = group[group["nodes"] == 1]
        base = (single if not single.empty else group).sort_values("world_size").iloc[0]
        index = group.index
        table.loc[index, "reference_world_size"] = base["world_size"]
        table.loc[index, "speedup"] = base["epoch_seconds"] / group["epoch_seconds"]
        ideal = group["world_size"] / base["world_size"]
        table.loc[index, "efficiency"] = table.loc[index, "speedup"] / ideal
        table.loc[index, "reference_gpu_hours"] = base["gpu_hours"]
    table["reference_world_size"] = table["reference_world_size"].astype(int)
    return table


def cost_table(summary: pd.DataFrame) -> pd.DataFrame:
    """GPU-hours per run and the speedup each extra GPU-hour buys (seed 004's cost analysis)."""
    runs = summary[summary["method"] == "transformer-ddp"]
    extra = runs["gpu_hours"] - runs["reference_gpu_hours"]
    per_hour = ((runs["speedup"] - 1) / extra).where(extra > 0)
    return pd.DataFrame(
        {
            **{c: runs[c] for c in RUN_ID},
            "run_wall_hours": runs["run_wall_seconds"] / 3600,
            "gpu_hours": runs["gpu_hours"],
            "extra_gpu_hours": extra,
            "cost_increase_pct": 100 * (runs["gpu_hours"] / runs["reference_gpu_hours"] - 1),
            "speedup": runs["speedup"],
            "efficiency": runs["efficiency"],
            "speedup_per_extra_gpu_hour": per_hour,
        }
    )


def baseline_rows(paths: list[str]) -> list[dict[str, Any]]:
    """Summary rows of the CPU baselines (accuracy and fit time; no scaling columns)."""
    records = [json.loads(Path(path).read_text()) for path in paths]
    return [
        {
            "configuration": record["configuration"],
            "method": record["method"],
            "world_size": 0,
            "nodes": 1,
            "device_type": "cpu",
            "processes_per_node": 1,
            "final_val_accuracy": record["val_accuracy"],
            "best_val_accuracy": record["val_accuracy"],
            "run_wall_seconds": record["fit_seconds"],
            "cpu_threads": record["threads"],
            "host": record["run_record"]["host"],
            "slurm_job_id": record["run_record"]["slurm_job_id"],
        }
        for record in records
    ]


def latex_table(summary: pd.DataFrame) -> str:
    """The summary as a booktabs table (needs \\usepackage{booktabs})."""
    lines = [
        r"\begin{tabular}{llrrrrrrrrr}",
        r"\toprule",
        r"Configuration & Method & GPUs & Global batch & Per-GPU batch & Epoch time (s) & "
        r"Speedup & Efficiency & Samples/s & Exposed comm. & Val.\ acc. \\",
        r"\midrule",
    ]

    def number(value: Any, fmt: str) -> str:
        return "--" if pd.isna(value) else format(value, fmt)

    for name, group in summary.groupby("configuration", sort=False):
        for _, row in group.iterrows():
            ddp = row["method"] == "transformer-ddp"
            gpus = f"{row['world_size']}" + (f" ({row['nodes']} nodes)" if row["nodes"] > 1 else "")
            cells = [
                _tex(name),
                "DDP" if ddp else _tex(row["method"]) + " (CPU)",
                gpus if ddp else "--",
                number(row["global_batch_size"], ".0f"),
                number(row["per_gpu_batch_size"], ".0f"),
                number(row["epoch_seconds"], ".2f"),
                number(row["speedup"], ".2f") + (r"$\times$" if ddp else ""),
                number(100 * row["efficiency"], ".1f") + (r"\%" if ddp else ""),
                number(row["samples_per_second"], ".0f"),
                number(100 * row["comm_exposed_share"], ".1f") + (r"\%" if ddp else ""),
                number(100 * row["final_val_accuracy"], ".1f") + r"\%",
            ]
            lines.append(" & ".join(cells) + r" \\")
        lines.append(r"\midrule")
    lines[-1] = r"\bottomrule"
    lines.append(r"\end{tabular}")
    return "\n".join(lines) + "\n"


def _tex(text: str) -> str:
    return text.translate({ord(char): "\\" + char for char in "\\&%$#_{}"})


def build(runs: list[dict[str, Any]], baselines: list[str]) -> pd.DataFrame:
    """The comprehensive summary: runs with speedup and efficiency, then the baselines."""
    table = add_speedup(pd.DataFrame([run_row(run) for run in runs]))
    table = pd.concat([table, pd.DataFrame(baseline_rows(baselines))], ignore_index=True)
    order = {name: i for i, name in enumerate(dict.fromkeys(r["configuration"] for r in runs))}
    table["_order"] = table["configuration"].map(order)
    table["_baseline"] = table["method"] != "transformer-ddp"
    table = table.sort_values(["_order", "_baseline", "nodes", "world_size"])
    return table.drop(columns=["_order", "_baseline"]).reset_index(drop=True)


def main(args: argparse.Namespace) -> None:
    """Write the epoch table, the comprehensive summary, the cost table and the LaTeX table."""
    runs = read_runs(args.runs)
    summary = build(runs, args.baselines)
    write_csv(args.out_epochs, epochs_table(runs))
    write_csv(args.out_summary, summary)
    write_csv(args.out_cost, cost_table(summary))
    write_text(args.out_tex, latex_table(summary))
    print(summary[["configuration", "method", "world_size", "epoch_seconds", "speedup"]])
