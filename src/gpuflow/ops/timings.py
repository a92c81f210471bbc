"""Measured job times that travel: a run's benchmark files kept as one small committed JSON.

Snakemake writes each job's wall time into its rule's `benchmark:` file, in the run's folder
and on the machine that ran it. `gpuflow record-timings` keeps them beside the gpu-check records
(`benchmarks/records/<date>-<device>-timings.json`: device, torch, CUDA, commit and, per
benchmark file by its path in the workflow, the mean seconds and the digest of the params the
job ran with), so that `gpuflow plan` elsewhere (a login node, before a grid is ever run there)
estimates from a measurement, not a guess, and only for jobs of the same params: a time
measured at 5 epochs never stands for a job of 75. A job resumed after a time limit or a
preemption has a benchmark of its last attempt only; the work its earlier attempts saved (the
job record's `earlier_attempts_s`, from its resume state) is added to it.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import math
import re
from pathlib import Path
from typing import Any

from gpuflow.cost.rules import done_work, has_work_model, params_fix_work, planned_work
from gpuflow.cost.work import Work
from gpuflow.job.record import record_of
from gpuflow.ops.snakemake_adapter import Dag, DagJob

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


def earlier_attempts_s(record: dict[str, Any]) -> float:
    """Seconds the earlier attempts of a finished job spent on the work it resumed, from its
    job record (0 for a job that ran in one attempt; `record` {} where it has none)."""
    timings = record.get("timings") if record.get("status") == "finished" else None
    seconds = timings.get("earlier_attempts_s", 0.0) if isinstance(timings, dict) else 0.0
    return float(seconds) if isinstance(seconds, int | float) else 0.0


def records(folder: Path) -> list[tuple[str, dict[str, Any]]]:
    """(file name, record) of every timings record in `folder`, newest first."""
    paths = sorted(Path(folder).glob(f"*{SUFFIX}"), reverse=True)
    found = ((path.name, read_record(path)) for path in paths if DATED.match(path.name))
    return [(name, record) for name, record in found if record is not None]


def _entry(value: Any) -> dict[str, Any] | None:
    """A benchmark entry as written by this module: positive finite seconds, params digest
    and, where known, the work the job did (a malformed one is dropped)."""
    if not isinstance(value, dict) or not isinstance(value.get("params"), str):
        return None
    seconds = value.get("seconds")
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        return None
    if not (math.isfinite(seconds) and seconds > 0):
        return None
    try:
        Work.from_dict(value["work"]) if "work" in value else None
    except (KeyError, TypeError, ValueError):
        return {k: v for k, v in value.items() if k != "work"}
    return value


def read_record(path: Path) -> dict[str, Any] | None:
    """A timings record with its well-formed entries only (None when unreadable): an
    entry of another format (e.g. bare seconds, with no params) can say nothing of a job."""
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("benchmarks"), dict):
        return None
    entries = {k: e for k, e in ((k, _entry(e)) for k, e in record["benchmarks"].items()) if e}
    devices = record.get("devices")
    named = isinstance(devices, list) and all(isinstance(d, str) for d in devices)
    return {**record, "benchmarks": entries, "devices": devices if named else ["?"]}


def measured(dag: Dag, directory: Path) -> tuple[dict[str, dict[str, Any]], int]:
    """benchmark path -> its mean seconds (with its earlier attempts') and the params the job
    ran with (what Snakemake recorded), for every job of the DAG (finished or to run) with a
    benchmark file; and how many files had no such record (left out: no one can say what they
    measured)."""
    found, unknown = {}, 0
    for job in [*dag.jobs, *dag.done]:
        if not job.benchmark or not job.output:
            continue
        seconds = benchmark_seconds(directory / job.benchmark)
        if seconds is None:
            continue
        ran = dag.records.ran_params.get(job.output[0])
        if ran is None:
            unknown += 1
            continue
        seconds += earlier_attempts_s(record_of(directory / output for output in job.output))
        found[job.benchmark] = {"seconds": seconds, "params": ran}
        work = job_work(job, dag.config, directory) if ran == job.params else None
        if work is not None:
            found[job.benchmark]["work"] = work.as_dict()
    return found, unknown


def job_work(job: DagJob, config: dict[str, Any], directory: Path) -> Work | None:
    """The work a finished job that ran with its params of `config` did (gpuflow.cost.rules):
    read from its outputs, or, where its params fix it, its rule's work under `config`; None
    without a work model."""
    if not has_work_model(job.rule):
        return None
    if params_fix_work(job.rule):
        return planned_work(job.rule, config, job.wildcards)
    inside = [str(directory / path) for path in job.output], [str(directory / p) for p in job.input]
    return done_work(job.rule, *inside)


def main(args: argparse.Namespace) -> None:
    """`gpuflow record-timings`: write the run's benchmark times as a record (a second run on
    the same day and device adds to that day's record)."""
    from gpuflow.cost.rates import slug as name_slug
    from gpuflow.job.atomic import write_json
    from gpuflow.job.devices import worker_devices
    from gpuflow.ops.gpu_check.records import device_slug, environment
    from gpuflow.ops.plan import plan_jobs

    directory = Path(args.directory)
    benchmarks, unknown = measured(plan_jobs(args, every_job=True), directory)
    if not benchmarks:
        raise SystemExit(f"record-timings: no benchmark file of a finished job under {directory}")
    devices = worker_devices("auto")
    checkout = Path(args.snakefile).resolve().parent if args.snakefile else Path.cwd()
    env = environment(devices, checkout)
    slug = device_slug(devices)
    if args.device:
        env["devices"] = [args.device]
        slug = name_slug(args.device)
    when = datetime.datetime.now(datetime.UTC)
    out = Path(args.out) / f"{when.date().isoformat()}-{slug}{SUFFIX}"
    earlier = read_record(out) if out.exists() else None
    if earlier is not None:
        benchmarks = {**earlier["benchmarks"], **benchmarks}
    record = {"created": when.isoformat(timespec="seconds"), **env, "benchmarks": benchmarks}
    write_json(out, record)
    skipped = f"; {unknown} without Snakemake's record of their params left out" if unknown else ""
    print(
        f"record-timings: {len(benchmarks)} benchmark files, measured on "
        f"{', '.join(record['devices'])}, written to {out}{skipped}"
    )
