"""`gpuflow ledger`: what a run spent against what was planned, per rule, with totals."""

from __future__ import annotations

import argparse
import json
import shutil
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from gpuflow.cost.benchmarks import earlier_attempts_s
from gpuflow.cost.expected import gpus_of
from gpuflow.cost.predict import Prediction
from gpuflow.job.record import record_of
from gpuflow.ops.plan import expected_times, plan_jobs, run_folder
from gpuflow.slurm.queue import Allocation, allocations, job_comment
from gpuflow.slurm.site import charges, read_site


@dataclass
class Line:
    """One rule's planned and spent time (seconds) and GPU-hours."""

    rule: str
    jobs: int = 0
    ended: int = 0
    sources: set[str] = field(default_factory=set)
    planned_s: float = 0.0
    planned_gpu_h: float = 0.0
    spent_s: float = 0.0
    spent_gpu_h: float = 0.0
    slurm_gpu_h: float = 0.0
    billing_h: float = 0.0
    units: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "sources": "/".join(sorted(self.sources, key="bmwsr".index))}

    def add(
        self,
        gpus: int,
        plan: Prediction,
        spent: tuple[float, bool],
        held: list[Allocation],
        per_gpu_hour: dict[str, float],
    ) -> None:
        """One job of `gpus` GPUs: its plan, the seconds it spent, what its allocations held."""
        self.jobs += 1
        self.sources.add(plan.source)
        self.planned_s += plan.seconds
        self.planned_gpu_h += gpus * plan.seconds / 3600
        self.spent_s += spent[0]
        self.ended += spent[1]
        self.spent_gpu_h += gpus * spent[0] / 3600
        for allocation in held:
            gpu_h = allocation.gpus * allocation.elapsed_s / 3600
            self.slurm_gpu_h += gpu_h
            self.billing_h += allocation.billing * allocation.elapsed_s / 3600
            self.units += per_gpu_hour.get(allocation.partition, 0.0) * gpu_h


def spent_seconds(record: dict[str, Any], now: float) -> tuple[float, bool]:
    """(seconds a job spent by its record, whether it ended); (0, False) without a record."""
    if not record:
        return 0.0, False
    if record.get("status") == "running":
        return max(0.0, now - float(record.get("started", now))), False
    wall = float(record.get("wall_s") or record.get("ended", 0) - record.get("started", 0))
    return wall + earlier_attempts_s(record), True


def ledger(args: argparse.Namespace) -> list[Line]:
    """One line per rule of the run's non-local jobs."""
    planned = plan_jobs(args, every_job=True)
    directory = Path(args.directory).resolve()
    with run_folder(args):
        expected = expected_times(args, planned, own=False)
        predicted = {id(job): expected.predict(job) for job in planned.jobs if not job.local}
    held: dict[str, list[Allocation]] = {}  # by comment (rule and wildcards); none without sacct
    for allocation in allocations(directory) if shutil.which("sacct") else []:
        held.setdefault(allocation.comment, []).append(allocation)
    site = read_site(planned.partition_config) if planned.partition_config else {}
    per_gpu_hour = charges(site)
    now = time.time()
    lines: dict[str, Line] = {}
    for job in planned.jobs:
        if job.local or not job.output:
            continue
        lines.setdefault(job.rule, Line(job.rule)).add(
            gpus_of(job),
            predicted[id(job)],
            spent_seconds(record_of(directory / out for out in job.output), now),
            held.get(job_comment(job.rule, job.wildcards.values()), []),
            per_gpu_hour,
        )
    order = {name: index for index, name in enumerate(planned.rule_order)}
    return sorted(lines.values(), key=lambda line: order.get(line.rule, len(order)))


def clock(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def render(lines: list[Line]) -> str:
    """The ledger as a table with totals."""
    slurm = any(line.slurm_gpu_h or line.billing_h for line in lines)
    units = any(line.units for line in lines)
    header = (
        f"{'rule':<26} {'ended':>9} {'planned':>10} {'src':>3} {'spent':>10} {'spent/plan':>10} "
        f"{'GPU-h plan':>10} {'GPU-h spent':>11}"
        + (f" {'sacct GPU-h':>11} {'billing-h':>9}" if slurm else "")
        + (f" {'units':>9}" if units else "")
    )
    rows = [header, "-" * len(header)]
    total = Line("total")
    for line in [*lines, total]:
        if line is total:
            rows.append("-" * len(header))
        ratio = f"{line.spent_s / line.planned_s:.2f}x" if line.planned_s and line.ended else "-"
        rows.append(
            f"{line.rule:<26} {f'{line.ended}/{line.jobs}':>9} {clock(line.planned_s):>10} "
            f"{'/'.join(sorted(line.sources, key='bmwsr'.index)):>3} {clock(line.spent_s):>10} "
            f"{ratio:>10} {line.planned_gpu_h:>10.3f} {line.spent_gpu_h:>11.3f}"
            + (f" {line.slurm_gpu_h:>11.3f} {line.billing_h:>9.2f}" if slurm else "")
            + (f" {line.units:>9.1f}" if units else "")
        )
        if line is not total:
            for name in (f.name for f in fields(Line) if f.name not in ("rule", "sources")):
                setattr(total, name, getattr(total, name) + getattr(line, name))
            total.sources |= line.sources
    rows += [
        "",
        "planned: each job's expected time before the run (src: m = a committed record's jobs,",
        "w = the work model at measured rates, s = with all-reduces at the site's datasheet",
        "bandwidth, r = the runtime limit); spent: the job records'",
        "wall time (so far, for running jobs) with what earlier attempts spent on resumed work;",
        "GPU-h = x the job's GPUs."
        + (
            " sacct: every allocation (each attempt), elapsed x GPUs and x billing."
            if slurm
            else ""
        ),
    ]
    return "\n".join(rows)


def main(args: argparse.Namespace) -> None:
    """Print the ledger (a table, or JSON with --json)."""
    lines = ledger(args)
    if args.json:
        print(json.dumps([line.as_dict() for line in lines], indent=2))
    else:
        print(render(lines))
