"""Measured job times that travel: a run's benchmark files kept as one small committed JSON.

Snakemake writes each job's wall time into its rule's `benchmark:` file, in the run's folder
and on the machine that ran it. `gpuflow record-timings` keeps them beside the gpu-check records
(`benchmarks/records/<date>-<device>-timings.json`: device, torch, CUDA, commit and, per
benchmark file by its path in the workflow, the mean seconds and the digest of the params the
job ran with), so that `gpuflow plan` elsewhere (a login node, before a grid is ever run there)
estimates from a measurement, not a guess, and only for jobs of the same params: a time
measured at 5 epochs never stands for a job of 75.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import re
from pathlib import Path
from typing import Any

from gpuflow.ops.snakemake_adapter import Dag

SUFFIX = "-timings.json"
DATED = re.compile(r"^\d{4}-\d{2}-\d{2}-.+" + re.escape(SUFFIX) + "$")


def benchmark_seconds(path: Path) -> float | None:
    """Mean wall time (column s) of a benchmark TSV; None when it holds none."""
    try:
        with open(path, newline="") as handle:
            values = [float(row["s"]) for row in csv.DictReader(handle, delimiter="\t")]
    except (OSError, KeyError, ValueError):
        return None
    return sum(values) / len(values) if values else None


def records(folder: Path) -> list[tuple[str, dict[str, Any]]]:
    """(file name, record) of every timings record in `folder`, newest first."""
    found = []
    for path in sorted(Path(folder).glob(f"*{SUFFIX}"), reverse=True):
        if not DATED.match(path.name):
            continue
        try:
            found.append((path.name, json.loads(path.read_text())))
        except (OSError, json.JSONDecodeError):
            continue
    return found


def measured(dag: Dag, directory: Path) -> tuple[dict[str, dict[str, Any]], int]:
    """benchmark path -> its mean seconds and the params the job ran with (what Snakemake
    recorded), for every job of the DAG with a benchmark file; and how many files had no such
    record (left out: no one can say what they measured)."""
    found, unknown = {}, 0
    for job in dag.jobs:
        if not job.benchmark or not job.output:
            continue
        seconds = benchmark_seconds(directory / job.benchmark)
        if seconds is None:
            continue
        ran = dag.records.ran_params.get(job.output[0])
        if ran is None:
            unknown += 1
            continue
        found[job.benchmark] = {"seconds": seconds, "params": ran}
    return found, unknown


def main(args: argparse.Namespace) -> None:
    """`gpuflow record-timings`: write the run's benchmark times as one record."""
    import torch

    from gpuflow.job.atomic import write_json
    from gpuflow.ops.gpu_check.records import device_slug, environment
    from gpuflow.ops.plan import plan_jobs

    directory = Path(args.directory)
    benchmarks, unknown = measured(plan_jobs(args, every_job=True), directory)
    if not benchmarks:
        raise SystemExit(f"record-timings: no benchmark file of a finished job under {directory}")
    devices = (
        [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available()
        else [torch.device("cpu")]
    )
    when = datetime.datetime.now(datetime.UTC)
    record = {
        "created": when.isoformat(timespec="seconds"),
        **environment(devices, directory),
        "benchmarks": benchmarks,
    }
    out = Path(args.out) / f"{when.date().isoformat()}-{device_slug(devices)}{SUFFIX}"
    write_json(out, record)
    skipped = f"; {unknown} without Snakemake's record of their params left out" if unknown else ""
    print(
        f"record-timings: {len(benchmarks)} benchmark files, measured on "
        f"{', '.join(record['devices'])}, written to {out}{skipped}"
    )
