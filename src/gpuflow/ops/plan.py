"""`gpuflow plan`: what a run would cost before it is submitted."""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import chdir, contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuflow.cost.benchmarks import benchmark_seconds, earlier_attempts_s
from gpuflow.cost.expected import Expected, gpus_of, runtime_s
from gpuflow.cost.models import done_work
from gpuflow.job.record import record_of
from gpuflow.ops.snakemake_adapter import Dag, DagJob, build_dag

if TYPE_CHECKING:
    from gpuflow.slurm.fit import PlannedJob


class Job(DagJob):
    """One job Snakemake would run (see gpuflow.ops.snakemake_adapter.DagJob)."""

    @property
    def gpus(self) -> int:
        """GPUs of the whole job (gpuflow.cost.expected.gpus_of)."""
        return gpus_of(self)

    @property
    def runtime_h(self) -> float:
        return runtime_s(self) / 3600


def wildcard_pattern(path: str, wildcards: dict[str, str]) -> str:
    """A glob over `path` for any wildcard values."""
    pattern = path
    for name, value in wildcards.items():
        token = f"{name}~{value}"
        if path.count(token) == 1:
            pattern = pattern.replace(token, f"{name}~*")
        elif value and path.count(value) == 1:
            pattern = pattern.replace(value, "*")
    return pattern


@contextmanager
def run_folder(args: argparse.Namespace) -> Iterator[None]:
    """Work in the run's folder (`--directory`), as the Snakemake that builds its DAG does."""
    args.timings = os.path.abspath(args.timings) if getattr(args, "timings", None) else None
    with chdir(args.directory):
        yield


def measured(dag: Dag) -> tuple[list[dict[str, Any]], int]:
    """The run folder's benchmark files of the DAG's jobs as job rows, and how many lack params."""
    rows, unknown = [], 0
    for job in [*dag.jobs, *dag.done]:
        if not job.benchmark or not job.output:
            continue
        seconds = benchmark_seconds(Path(job.benchmark))
        if seconds is None:
            continue
        ran = dag.records.ran_params.get(job.output[0])
        if ran is None:
            unknown += 1
            continue
        seconds += earlier_attempts_s(record_of(Path(output) for output in job.output))
        entry = {"rule": job.rule, "wildcards": job.wildcards, "seconds": seconds, "params": ran}
        work = done_work(job.rule, dag.config, job) if ran == job.params else None
        if work is not None:
            entry["work"] = work.as_dict()
        rows.append({"path": job.benchmark, "job": entry})
    return rows, unknown


def expected_times(args: argparse.Namespace, planned: Dag, own: bool = True) -> Expected:
    """The expected times of the planned jobs (inside `run_folder`)."""
    from gpuflow.slurm.site import interconnect, read_site

    site = read_site(planned.partition_config) if planned.partition_config else {}
    gpu = args.gpu or site.get("gpu_model")
    rows = measured(planned)[0] if own else []
    return Expected(planned.config, rows, args.timings, gpu and str(gpu), interconnect(site))


def plan_jobs(args: argparse.Namespace, every_job: bool = False) -> Dag:
    """The DAG Snakemake would run for these options, its jobs as `Job`s."""
    dag = build_dag(args, every_job)
    dag.jobs = [Job(**vars(job)) for job in dag.jobs]
    return dag


def earlier_use(job: Job, threshold: float) -> dict[str, Any]:
    """GPU-hours, mean utilisation and flag of the earlier jobs of `job`'s rule."""
    from gpuflow.job.paths import RECORD, job_file
    from gpuflow.job.record import ended, read_record
    from gpuflow.job.record_tables import rule_summary

    globs = [wildcard_pattern(output, job.wildcards) for output in job.output]
    paths = {p for g in globs for p in glob.glob(str(job_file(Path(g), RECORD)))}
    records = [r for r in map(read_record, sorted(paths)) if r is not None and ended(r)]
    return rule_summary(records, threshold)


def summarise(
    jobs: list[Job],
    expected: Expected,
    arrays: set[str],
    array_limit: int,
    per_node: int,
    charge: Callable[[Job], float | None] | None,
    telemetry: Callable[[Job], dict[str, Any]],
) -> list[dict[str, Any]]:
    """One row per rule: counts, expected hours, limits, GPU-hours, units, submissions."""
    rows: dict[str, dict[str, Any]] = {}
    for job in jobs:
        if job.rule == "all" and not job.output:
            continue
        sums = ("expected_h", "low_h", "high_h", "gpu_h_requested", "gpu_h_expected", "limit_gpu_h")
        row = rows.setdefault(
            job.rule,
            {"rule": job.rule, "jobs": 0, "local": job.local, "limit_jobs": 0, "why": {}}
            | {key: set() for key in ("gpus_per_job", "sources", "basis", "notes", "stand_ins")}
            | {"limits_min": set(), **dict.fromkeys(sums, 0.0)},
        )
        predicted = expected.predict(job)
        row["jobs"] += 1
        row["gpus_per_job"].add(job.gpus)
        row["expected_h"] += predicted.seconds / 3600
        row["low_h"] += predicted.low / 3600
        row["high_h"] += predicted.high / 3600
        row["sources"].add(predicted.source)
        row["basis"].update(predicted.basis)
        row["notes"].update(note for note in predicted.notes if note)
        row["stand_ins"].update(predicted.stand_ins)
        row["limits_min"].add(round(job.runtime_h * 60))
        row["gpu_h_requested"] += job.gpus * job.runtime_h
        row["gpu_h_expected"] += job.gpus * predicted.seconds / 3600
        if predicted.source == "r":
            row["limit_jobs"] += 1
            row["limit_gpu_h"] += job.gpus * predicted.seconds / 3600
        row["why"][job.why] = row["why"].get(job.why, 0) + 1
    for row in rows.values():
        row["benchmarks_other_params"] = expected.other_params(
            [job for job in jobs if job.rule == row["rule"]]
        )
        n = row["jobs"]
        row["expected_h_per_job"] = row.pop("expected_h") / n
        row["range_h_per_job"] = [row.pop("low_h") / n, row.pop("high_h") / n]
        row["source"] = "/".join(sorted(row.pop("sources"), key="bmwsr".index))
        row["from_benchmarks"] = "b" in row["source"]
        row["from_record"] = next(
            (b for b in sorted(row["basis"]) if b.endswith("-timings.json")), None
        )
        for key in ("basis", "notes", "limits_min"):
            row[key] = sorted(row[key])
        row["stand_ins"] = [asdict(stand_in) for stand_in in sorted(row["stand_ins"])]
        row["gpus_per_job"] = "/".join(str(g) for g in sorted(row["gpus_per_job"]))
        row["sbatch"] = (
            0
            if row["local"]
            else math.ceil(n / array_limit)
            if row["rule"] in arrays and n > 1
            else n
        )
        row["node_h"] = row["gpu_h_expected"] / per_node
    for job in jobs if charge else ():
        rate = charge(job) if job.rule in rows and not job.local else None
        if rate is not None:
            row = rows[job.rule]
            gpu_h = job.gpus * row["expected_h_per_job"]
            row["units_expected"] = row.get("units_expected", 0.0) + rate * gpu_h
    for job in jobs:
        if job.rule in rows and "telemetry" not in rows[job.rule]:
            rows[job.rule]["telemetry"] = telemetry(job)
    return list(rows.values())


def hours(value: float) -> str:
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


def duration(value_h: float) -> str:
    seconds = value_h * 3600
    if seconds < 120:
        return f"{seconds:.0f} s" if seconds >= 9.5 else f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{value_h:.1f} h"


def render(
    rows: list[dict[str, Any]], per_node: int, seconds: float, measured_on: dict[str, str]
) -> str:
    """The plan as a table with totals, its sources and the re-run summary."""
    header = (
        f"{'rule':<26} {'jobs':>5} {'GPUs':>5} {'time/job':>10} {'src':>3} {'range':>15} "
        f"{'limit':>9} {'GPU-h req':>9} {'GPU-h exp':>9} {'sbatch':>6} {'node-h':>7}  why"
    )
    lines = [header, "-" * len(header)]
    for row in rows:
        why = ", ".join(f"{k} {v}" for k, v in sorted(row["why"].items()))
        low, high = row["range_h_per_job"]
        span = "-" if row["source"] == "r" else f"{duration(low)}-{duration(high)}"
        found = row["limits_min"]
        limit = f"{found[0]}" if len(found) == 1 else f"{found[0]}-{found[-1]}"
        lines.append(
            f"{row['rule']:<26} {row['jobs']:>5} {row['gpus_per_job']:>5} "
            f"{duration(row['expected_h_per_job']):>10} {row['source']:>3} {span:>15} "
            f"{limit + ' min':>9} {hours(row['gpu_h_requested']):>9} "
            f"{hours(row['gpu_h_expected']):>9} {row['sbatch']:>6} {hours(row['node_h']):>7}  {why}"
        )
    total = {
        key: sum(row[key] for row in rows)
        for key in ("jobs", "gpu_h_requested", "gpu_h_expected", "sbatch", "node_h")
    }
    lines += [
        "-" * len(header),
        f"{'total':<26} {total['jobs']:>5} {'':>5} {'':>10} {'':>3} {'':>15} {'':>9} "
        f"{hours(total['gpu_h_requested']):>9} {hours(total['gpu_h_expected']):>9} "
        f"{total['sbatch']:>6} {hours(total['node_h']):>7}",
    ]
    lines.append(limits_line(rows))
    units = [row for row in rows if "units_expected" in row]
    if units:
        lines.append(
            f"Allocation expected: {sum(r['units_expected'] for r in units):.0f} units at the"
            " site file's charges per GPU-hour"
        )
    lines += [
        "",
        "src: b = this folder's benchmarks of the rule's jobs, m = a committed record of them",
        "(both scaled by each job's work), w = the work model at measured rates, s = the same",
        "with all-reduces at the site file's interconnect bandwidth (datasheet, not measured),",
        "r = the rule's runtime limit (no prediction). range: the rates' spread.",
        f"limit = the job's time limit (first attempt); GPU-h req = GPUs x limit; node-h = "
        f"expected GPU-hours / {per_node} GPUs per node. sbatch: job arrays count once per chunk.",
    ]
    lines += [f"m: {name}, measured on {devices}" for name, devices in sorted(measured_on.items())]
    lines += source_lines(rows)
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


def limits_line(rows: list[dict[str, Any]]) -> str:
    """How much of the plan is time limits standing in for predictions (`r`)."""
    guessed = [row for row in rows if row["limit_jobs"]]
    if not guessed:
        return "Every job's time is predicted: no rule falls back to its limit."
    jobs = sum(row["limit_jobs"] for row in guessed)
    gpu_h = sum(row["limit_gpu_h"] for row in guessed)
    total = sum(row["gpu_h_expected"] for row in rows)
    share = f"{gpu_h / total:.0%} of the expected GPU-hours" if total else "no GPU-hours"
    gpu = [row["rule"] for row in guessed if row["gpus_per_job"] != "0"]
    named = f"; GPU rules: {', '.join(gpu)}" if gpu else ""
    return (
        f"Not predicted (r: the limit stands in): {jobs} jobs of {len(guessed)} rules,"
        f" {hours(gpu_h)} GPU-h, {share}{named}."
    )


def source_lines(rows: list[dict[str, Any]]) -> list[str]:
    """What each non-local rule's times rest on (records) or lack (a rate, its inputs)."""
    lines = []
    for row in rows:
        if row["local"] or not (row["basis"] or row["notes"] or row["stand_ins"]):
            continue
        rests = f"{row['source']} from {', '.join(row['basis'])}" if row["basis"] else row["source"]
        notes = "; ".join([*row["notes"], *stand_in_notes(row["stand_ins"])])
        lines.append(f"{row['rule']}: {rests}" + (f" ({notes})" if notes else ""))
    return ["", "Sources:", *lines] if lines else []


def stand_in_notes(stand_ins: list[dict[str, str]]) -> list[str]:
    """Each rate taken for other shapes, said once."""
    taken: dict[tuple[str, str], list[str]] = {}
    for stand_in in stand_ins:
        taken.setdefault((stand_in["kind"], stand_in["measured"]), []).append(stand_in["wanted"])
    notes = []
    for (kind, measured), shapes in taken.items():
        shown = ", ".join(shapes[:2]) + (", ..." if len(shapes) > 2 else "")
        which = (
            f"taken for {len(shapes)} other shapes ({shown})" if shapes[1:] else f"not {shapes[0]}"
        )
        notes.append(f"{kind} measured at {measured}, {which}")
    return notes


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
    threshold = low_utilisation(planned.config)
    with run_folder(args):
        expected = expected_times(args, planned)
        rows = summarise(
            planned.jobs,
            expected,
            planned.array_rules,
            planned.array_limit,
            args.gpus_per_node,
            charge_of_job(planned),
            lambda job: earlier_use(job, threshold),
        )
        placement = perplexity_placement(planned.config)
    order = {name: index for index, name in enumerate(planned.rule_order)}
    rows.sort(key=lambda row: (order.get(row["rule"], len(order)), row["rule"]))
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        used = {row["from_record"] for row in rows if row["from_record"]}
        measured_on = {name: expected.devices(name) for name in used}
        print(render(rows, args.gpus_per_node, time.monotonic() - started, measured_on))
        if placement:
            print(f"Perplexity placement: {placement}")
        for warning in (unfit_partitions(planned), unwarned_limits(planned, rows)):
            if warning:
                print(warning)


def charge_of_job(planned: Dag) -> Callable[[Job], float | None] | None:
    """Allocation units per GPU-hour of a job's partition, where the site file has charges."""
    if not planned.partition_config:
        return None
    from gpuflow.slurm.fit import partition_of, read_partitions
    from gpuflow.slurm.site import charges, read_site

    per_gpu_hour = charges(read_site(planned.partition_config))
    if not per_gpu_hour:
        return None
    partitions = read_partitions(planned.partition_config)

    def charge(job: Job) -> float | None:
        name = partition_of(submitted(job), partitions)
        return per_gpu_hour.get(name) if name else None

    return charge


def unfit_partitions(planned: Dag) -> str | None:
    """Under a SLURM profile, the rules with a job that fits no partition, else None."""
    if not planned.partition_config:
        return None
    from gpuflow.slurm.fit import unfit_report

    jobs = (submitted(job) for job in planned.jobs if not job.local)
    return unfit_report(jobs, planned.partition_config)


def submitted(job: Job) -> PlannedJob:
    """The job as the SLURM plugin submits it (gpuflow.slurm.fit)."""
    from gpuflow.slurm.fit import PlannedJob

    return PlannedJob(job.rule, job.resources, int(job.resources.get("_cores", 1)), job.wildcards)


def unwarned_limits(planned: Dag, rows: list[dict[str, Any]]) -> str | None:
    """The GPU rules whose time limit is no longer than the site's stop warning, else None."""
    if not planned.partition_config:
        return None
    from gpuflow.cost.limits import WARNING_EARLY_MINUTES, unwarned
    from gpuflow.slurm.site import read_site, stop_warning_minutes

    warning = stop_warning_minutes(read_site(planned.partition_config))
    short = {
        row["rule"]: min(row["limits_min"])
        for row in rows
        if not row["local"]
        and row["gpus_per_job"] != "0"
        and row["limits_min"]
        and unwarned(min(row["limits_min"]), warning)
    }
    if not short:
        return None
    named = ", ".join(f"{rule} ({minutes} min)" for rule, minutes in short.items())
    return (
        f"{len(short)} GPU rule(s) ask for a time limit no longer than the site's stop warning"
        f" ({warning:g} min, sent up to {WARNING_EARLY_MINUTES:g} min early): {named}. SLURM"
        " warns such a job as it starts, before it has anything to save, and it ends at its limit"
        " (SIGTERM, with KillWait to save in). Give them `runtime: auto` or a longer limit."
    )


def low_utilisation(config: dict[str, Any]) -> float:
    """The flag threshold of the planned workflow's config, else the schema's default."""
    from gpuflow.settings.blocks import defaulted

    telemetry = defaulted(dict(config.get("telemetry") or {}), "telemetry")
    return float(telemetry["low_utilisation_percent"])


def perplexity_placement(config: dict[str, Any]) -> str | None:
    """How the perplexity jobs will hold the reference LM, when the fluency family is on."""
    if "fluency" not in config.get("families", []):  # e.g. another workflow, or fluency off
        return None
    from gpuflow.fluency.placement import fluency_placement

    return fluency_placement(config["fluency"])


def record_timings(args: argparse.Namespace) -> None:
    """`gpuflow record-timings`: the run's benchmark times as rows of today's record."""
    from gpuflow.cost.records import add_rows, dated, environment, slug
    from gpuflow.job.devices import worker_devices

    planned = plan_jobs(args, every_job=True)
    out_folder = Path(args.out).resolve()
    with run_folder(args):
        rows, unknown = measured(planned)
    if not rows:
        raise SystemExit(
            f"record-timings: no benchmark file of a finished job under {args.directory}"
        )
    checkout = Path(args.snakefile).resolve().parent if args.snakefile else Path.cwd()
    env = environment(worker_devices("auto"), checkout)
    if args.device:
        env.update(devices=[args.device], device_class=slug(args.device))
    out = dated(out_folder, env["device_class"], "-timings")
    record = add_rows(out, env, rows)
    skipped = f"; {unknown} without Snakemake's record of their params left out" if unknown else ""
    print(
        f"record-timings: {len(record['rows'])} benchmark files, measured on "
        f"{', '.join(record['devices'])}, written to {out}{skipped}"
    )
