"""Measured job times that travel: a run's benchmark files kept as one small committed JSON.

Snakemake writes each job's wall time into its rule's `benchmark:` file, in the run's folder
and on the machine that ran it. `gpuflow record-timings` keeps them beside the gpu-check records
(`benchmarks/records/<date>-<device>-timings.json`: device, torch, CUDA, commit and the mean
seconds of every benchmark file, by its path in the workflow), so that `gpuflow plan` elsewhere
(a login node, before a grid is ever run there) estimates from a measurement, not a guess.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import re
from pathlib import Path
from typing import Any

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


def collect(directory: Path) -> dict[str, float]:
    """Every benchmark file under `directory` (its path relative to it) -> mean seconds."""
    found = {}
    for path in sorted(Path(directory).glob("**/benchmarks/**/*.tsv")):
        relative = path.relative_to(directory)
        if relative.parts[0].startswith("."):
            continue
        seconds = benchmark_seconds(path)
        if seconds is not None:
            found[relative.as_posix()] = seconds
    return found


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


def main(args: argparse.Namespace) -> None:
    """`gpuflow record-timings`: write the run's benchmark times as one record."""
    import torch

    from gpuflow.job.atomic import write_json
    from gpuflow.ops.gpu_check.records import device_slug, environment

    measured = collect(Path(args.directory))
    if not measured:
        raise SystemExit(f"record-timings: no benchmark files under {args.directory}")
    devices = (
        [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available()
        else [torch.device("cpu")]
    )
    when = datetime.datetime.now(datetime.UTC)
    record = {
        "created": when.isoformat(timespec="seconds"),
        **environment(devices, Path(args.directory)),
        "benchmarks": measured,
    }
    out = Path(args.out) / f"{when.date().isoformat()}-{device_slug(devices)}{SUFFIX}"
    write_json(out, record)
    print(
        f"record-timings: {len(measured)} benchmark files, measured on "
        f"{', '.join(record['devices'])}, written to {out}"
    )
