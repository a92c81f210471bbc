"""`gpuflow plan`: what a run would cost before it is submitted.

Builds the DAG Snakemake would run (in-process, with the same profile, config files and
targets) and prints per rule: jobs, GPUs per job, expected time per job, GPU-hours requested
(`runtime` of the first attempt) and expected, sbatch submissions (job arrays counted as one
per chunk) and node-hours if jobs are packed `--gpus-per-node` GPUs to a node; then totals, and
why each job would run: its outputs are missing, left incomplete by a killed or failed job (the
part a re-run after a partial failure redoes), changed, or downstream of those.

Beside it, per rule, what earlier jobs of the rule used (their job records,
`<family>/jobs/<output>.record.json`, any wildcard values): GPU-hours, mean utilisation, and the
flag of rules below config `telemetry.low_utilisation_percent` with the most likely reason.

Expected time per job comes from earlier `benchmark:` files of the same rule's jobs that ran
with the job's params (Snakemake's record of them; wildcard values may differ: gpuflow.ops.
snakemake_adapter.params_digest), each with the time its earlier attempts saved (resumed jobs,
gpuflow.ops.timings), scaled by size-like numeric wildcards (SIZE_WILDCARDS) when the job's value
differs: first the run folder's own, of the targets' jobs; else the newest committed timings
record that measured them (`gpuflow record-timings`, `--timings`); else the rule's `runtime`. A
benchmark of 5 epochs never stands for a job of 75. Benchmarks measure the machine they ran on:
a record names it.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import re
import time
from pathlib import Path
from typing import Any

from gpuflow.ops.snakemake_adapter import Dag, DagJob, build_dag
from gpuflow.ops.timings import measured
from gpuflow.ops.timings import records as timings_records

# Not a label fraction: an SSVAE epoch walks the unlabelled digits, so its time hardly moves
# with the labelled share (5,000 labels of 50,000: 450 steps an epoch against 499 at 100).
SIZE_WILDCARDS = ("n", "size", "samples", "steps", "epochs", "tokens", "texts")


class Job(DagJob):
    """One job Snakemake would run (see gpuflow.ops.snakemake_adapter.DagJob)."""

    @property
    def gpus(self) -> int:
        """GPUs of the whole job: `gpu`, or nodes x the GPUs per node of `gres` (gpu:N or
        gpu:<model>:N, as sbatch --gres counts them) for multi-node rules."""
        gres = str(self.resources.get("gres", ""))
        per_node = re.search(r"\bgpu(?::[^:,]+)?:(\d+)", gres)
        if per_node:
            return int(float(self.resources.get("nodes", 1) or 1)) * int(per_node[1])
        return int(float(self.resources.get("gpu", 0) or 0))

    @property
    def runtime_h(self) -> float:
        return float(self.resources.get("runtime", 0) or 0) / 60


Planned = Dag


def plan_jobs(args: argparse.Namespace, every_job: bool = False) -> Planned:
    """The DAG Snakemake would run for these options (gpuflow.ops.snakemake_adapter.build_dag).

    With `every_job`, the DAG holds every job of the targets, finished or not (--forceall).
    """
    dag = build_dag(args, every_job)
    dag.jobs = [Job(**vars(job)) for job in dag.jobs]
    return dag


def benchmark_regex(job: Job) -> re.Pattern[str] | None:
    """A regex reading the wildcard values of the rule's benchmark paths (any values)."""
    return wildcard_pattern(job.benchmark, job.wildcards)[1] if job.benchmark else None


def wildcard_pattern(path: str, wildcards: dict[str, str]) -> tuple[str, re.Pattern[str]]:
    """A glob over `path` for any wildcard values, and a regex reading them back.

    Wildcards appear as `name~value` (Paramspace style) or as a value found once in the path.
    """
    pattern, regex = path, re.escape(path)
    for name, value in wildcards.items():
        token = f"{name}~{value}"
        if path.count(token) == 1:
            old, prefix = token, f"{name}~"
        elif value and path.count(value) == 1:
            old, prefix = value, ""
        else:
            continue
        pattern = pattern.replace(old, f"{prefix}*")
        regex = regex.replace(re.escape(old), re.escape(prefix) + f"(?P<{name}>[^/]+)")
    return pattern, re.compile(regex + "$")


def size_of(wildcards: dict[str, str]) -> float:
    """Product of the size-like numeric wildcards (1 when there are none)."""
    size = 1.0
    for name, value in wildcards.items():
        if name.lower() in SIZE_WILDCARDS:
            try:
                size *= float(value)
            except ValueError:
                continue
    return size


def matching(measured: dict[str, float], regex: re.Pattern[str]) -> list[tuple[float, float]]:
    """(seconds, size) of the benchmark paths the rule's pattern reads."""
    found = []
    for path, seconds in measured.items():
        match = regex.match(path)
        if match:
            found.append((seconds, size_of(match.groupdict())))
    return found


def recorded(record: dict[str, Any], params: str) -> dict[str, float]:
    """A timings record's seconds per benchmark path, of jobs that ran with `params`."""
    entries = record["benchmarks"].items()
    return {path: entry["seconds"] for path, entry in entries if entry["params"] == params}


class Benchmarks:
    """Earlier benchmark times of the jobs' rule and params: the run folder's own (its DAG's
    jobs, finished or not, read once), else the newest committed timings record
    (gpuflow.ops.timings) that measured them."""

    def __init__(self, planned: Planned, directory: str, timings: str | None = None):
        self.own = {"benchmarks": measured(planned, Path(directory))[0]}
        self.records = timings_records(Path(timings)) if timings else []
        self.found: dict[tuple[str, str], tuple[list[tuple[float, float]], str]] = {}

    def samples(self, job: Job) -> tuple[list[tuple[float, float]], str]:
        """(seconds, size) of every earlier benchmark of the job's rule and params, and where
        they came from: 'bench' (this folder's), a timings record's file name, or 'runtime'
        (searched once per rule and params)."""
        regex = benchmark_regex(job)
        if regex is None:
            return [], "runtime"
        key = (job.rule, job.params)
        if key not in self.found:
            self.found[key] = ([], "runtime")
            for name, record in [("bench", self.own), *self.records]:
                samples = matching(recorded(record, job.params), regex)
                if samples:
                    self.found[key] = (samples, name)
                    break
        return self.found[key]

    def expected_hours(self, job: Job) -> tuple[float, str]:
        """Expected hours of a job and their source (see `samples`; else its runtime)."""
        samples, source = self.samples(job)
        if not samples:
            return job.runtime_h, "runtime"
        size = size_of(job.wildcards)
        scaled = [seconds * size / bench_size for seconds, bench_size in samples if bench_size]
        return sum(scaled) / len(scaled) / 3600, source

    def other_params(self, jobs: list[Job]) -> int:
        """How many of this folder's benchmark files of the rule of `jobs` ran with params none
        of them has (left out of their expected time: 5 epochs say nothing of 75)."""
        regex = benchmark_regex(jobs[0])
        if regex is None:
            return 0
        params = {job.params for job in jobs}
        entries = self.own["benchmarks"].items()
        return sum(1 for path, e in entries if e["params"] not in params and regex.match(path))

    def devices(self, name: str) -> str:
        """What the timings record `name` was measured on."""
        for record_name, record in self.records:
            if record_name == name:
                return ", ".join(record.get("devices") or ["?"])
        return "?"


class Telemetry:
    """Earlier jobs' records per rule (their telemetry), read once."""

    def __init__(self, directory: str, threshold: float):
        self.directory = Path(directory)
        self.threshold = threshold
        self.cache: dict[str, dict[str, Any]] = {}

    def of_rule(self, job: Job) -> dict[str, Any]:
        """GPU-hours used, mean utilisation and flag of the rule's earlier jobs."""
        from gpuflow.job.paths import RECORD, job_file
        from gpuflow.job.record import ended, read_record
        from gpuflow.job.telemetry.tables import rule_summary

        if job.rule not in self.cache:
            paths = {
                name
                for output in job.output
                for name in glob.glob(
                    str(
                        job_file(
                            self.directory / wildcard_pattern(output, job.wildcards)[0], RECORD
                        )
                    )
                )
            }
            records = [r for r in map(read_record, sorted(paths)) if r is not None]
            summaries = [record for record in records if ended(record)]
            self.cache[job.rule] = rule_summary(summaries, self.threshold)
        return self.cache[job.rule]


def summarise(
    jobs: list[Job],
    benchmarks: Benchmarks,
    arrays: set[str],
    array_limit: int,
    per_node: int,
    telemetry: Telemetry | None = None,
) -> list[dict[str, Any]]:
    """One row per rule with counts, hours and submissions."""
    rows: dict[str, dict[str, Any]] = {}
    for job in jobs:
        if job.rule == "all" and not job.output:
            continue
        row = rows.setdefault(
            job.rule,
            {
                "rule": job.rule,
                "jobs": 0,
                "local": job.local,
                "gpus_per_job": set(),
                "expected_h": 0.0,
                "from_benchmarks": False,
                "from_record": None,
                "gpu_h_requested": 0.0,
                "gpu_h_expected": 0.0,
                "why": {},
            },
        )
        hours, source = benchmarks.expected_hours(job)
        row["jobs"] += 1
        row["gpus_per_job"].add(job.gpus)
        row["expected_h"] += hours
        row["from_benchmarks"] |= source == "bench"
        if source not in ("bench", "runtime"):
            row["from_record"] = source
        row["gpu_h_requested"] += job.gpus * job.runtime_h
        row["gpu_h_expected"] += job.gpus * hours
        row["why"][job.why] = row["why"].get(job.why, 0) + 1
    for row in rows.values():
        row["benchmarks_other_params"] = benchmarks.other_params(
            [job for job in jobs if job.rule == row["rule"]]
        )
        n = row["jobs"]
        row["expected_h_per_job"] = row.pop("expected_h") / n
        row["gpus_per_job"] = "/".join(str(g) for g in sorted(row["gpus_per_job"]))
        row["sbatch"] = (
            0
            if row["local"]
            else math.ceil(n / array_limit)
            if row["rule"] in arrays and n > 1
            else n
        )
        row["node_h"] = row["gpu_h_expected"] / per_node
    if telemetry is not None:
        for job in jobs:
            if job.rule in rows:
                rows[job.rule].setdefault("telemetry", telemetry.of_rule(job))
    return list(rows.values())


def hours(value: float) -> str:
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


def duration(value_h: float) -> str:
    minutes = value_h * 60
    return f"{minutes:.1f} min" if minutes < 120 else f"{value_h:.1f} h"


def render(
    rows: list[dict[str, Any]], per_node: int, seconds: float, measured_on: dict[str, str]
) -> str:
    """The plan as a table with totals and the re-run summary; `measured_on` names the
    devices of each timings record a row's time came from."""
    header = (
        f"{'rule':<28} {'jobs':>5} {'GPUs':>5} {'time/job':>14} {'GPU-h req':>10} "
        f"{'GPU-h exp':>10} {'sbatch':>7} {'node-h':>8}  why"
    )
    lines = [header, "-" * len(header)]
    for row in rows:
        source = "b" if row["from_benchmarks"] else "m" if row["from_record"] else "r"
        why = ", ".join(f"{k} {v}" for k, v in sorted(row["why"].items()))
        lines.append(
            f"{row['rule']:<28} {row['jobs']:>5} {row['gpus_per_job']:>5} "
            f"{duration(row['expected_h_per_job']) + ' ' + source:>14} "
            f"{hours(row['gpu_h_requested']):>10} {hours(row['gpu_h_expected']):>10} "
            f"{row['sbatch']:>7} {hours(row['node_h']):>8}  {why}"
        )
    total = {
        key: sum(row[key] for row in rows)
        for key in ("jobs", "gpu_h_requested", "gpu_h_expected", "sbatch", "node_h")
    }
    lines += [
        "-" * len(header),
        f"{'total':<28} {total['jobs']:>5} {'':>5} {'':>14} "
        f"{hours(total['gpu_h_requested']):>10} {hours(total['gpu_h_expected']):>10} "
        f"{total['sbatch']:>7} {hours(total['node_h']):>8}",
        "",
        "time/job: b = mean of the benchmark files of this folder's jobs of the rule that ran",
        "with the same params (scaled by size wildcards), m = the same from a committed timings",
        "record, r = the rule's runtime (first attempt).",
        f"GPU-h req = GPUs x runtime; node-h = expected GPU-hours / {per_node} GPUs per node.",
        "sbatch: job arrays count once per chunk.",
    ]
    lines += [f"m: {name}, measured on {devices}" for name, devices in sorted(measured_on.items())]
    lines += [
        f"{row['rule']}: {row['benchmarks_other_params']} benchmark file(s) of this folder's jobs "
        "ran with other params, left out"
        for row in rows
        if row["benchmarks_other_params"]
    ]
    lines += telemetry_lines(rows)
    resume = sum(row["why"].get(k, 0) for row in rows for k in ("missing", "incomplete"))
    incomplete = sum(row["why"].get("incomplete", 0) for row in rows)
    lines.append(
        f"Re-run after a partial failure: {resume} jobs lack their outputs "
        f"({incomplete} left incomplete); the rest run because their inputs will change. "
        f"Plan made in {seconds:.1f} s."
    )
    return "\n".join(lines)


def telemetry_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Per rule, what its earlier jobs used (from their job records), flagged."""
    measured = [row for row in rows if row.get("telemetry", {}).get("jobs_measured")]
    if not measured:
        return ["Earlier jobs: no job records of these rules yet."] if rows else []
    lines = [
        "",
        f"{'earlier jobs of the rule':<28} {'jobs':>5} {'GPU-h used':>10} {'mean util':>12}  flag",
    ]
    for row in measured:
        seen = row["telemetry"]
        util = seen["util_mean"]
        shown = "-" if util is None else f"{util:.0f}% {seen['util_kind']}"
        lines.append(
            f"{row['rule']:<28} {seen['jobs_measured']:>5} {hours(seen['gpu_h_used']):>10} "
            f"{shown:>12}  {seen['flag'] or 'ok'}"
        )
    return [*lines, ""]


def main(args: argparse.Namespace) -> None:
    """Print the plan (a table, or JSON with --json)."""
    started = time.monotonic()
    planned = plan_jobs(args)
    benchmarks = Benchmarks(planned, args.directory, args.timings)
    rows = summarise(
        planned.jobs,
        benchmarks,
        planned.array_rules,
        planned.array_limit,
        args.gpus_per_node,
        Telemetry(args.directory, low_utilisation(planned.config)),
    )
    order = {name: index for index, name in enumerate(planned.rule_order)}
    rows.sort(key=lambda row: (order.get(row["rule"], len(order)), row["rule"]))
    placement = perplexity_placement(planned.config)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        used = {row["from_record"] for row in rows if row["from_record"]}
        measured_on = {name: benchmarks.devices(name) for name in used}
        print(render(rows, args.gpus_per_node, time.monotonic() - started, measured_on))
        if placement:
            print(f"Perplexity placement: {placement}")
        unfit = unfit_partitions(planned)
        if unfit:
            print(unfit)


def unfit_partitions(planned: Planned) -> str | None:
    """Under a SLURM profile, the rules with a job that fits no partition of its site file
    (gpuflow.slurm.fit), else None."""
    if not planned.partition_config:
        return None
    from gpuflow.slurm.fit import PlannedJob, unfit_report

    submitted = (
        PlannedJob(
            job.rule,
            job.resources,
            int(job.resources.get("_cores", 1)),
            job.wildcards,
        )
        for job in planned.jobs
        if not job.local
    )
    return unfit_report(submitted, planned.partition_config)


def low_utilisation(config: dict[str, Any]) -> float:
    """The flag threshold of the planned workflow's config, else the schema's default."""
    from gpuflow.settings.blocks import defaulted

    telemetry = defaulted(dict(config.get("telemetry") or {}), "telemetry")
    return float(telemetry["low_utilisation_percent"])


def perplexity_placement(config: dict[str, Any]) -> str | None:
    """How the perplexity jobs will hold the reference LM, when the fluency family is on.

    Imported here: the placement module needs torch, which the rest of the plan does not.
    """
    if "fluency" not in config.get("families", []):  # e.g. another workflow, or fluency off
        return None
    from gpuflow.fluency.placement import fluency_placement

    return fluency_placement(config["fluency"])
