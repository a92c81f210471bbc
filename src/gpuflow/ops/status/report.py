"""The status as a dict (the `--json` schema, documented in docs/status.md) and as tables."""

from __future__ import annotations

import time
from typing import Any

from gpuflow.ops.plan import hours
from gpuflow.ops.status.collect import STATES, JobStatus, Seen

HOURS = ("hours_left", "gpu_h_spent", "gpu_h_left")  # summed per rule and in total


def rule_rows(statuses: list[JobStatus], rule_order: list[str]) -> list[dict[str, Any]]:
    """One row per rule: family, jobs in each state, GPU-hours spent and still expected."""
    rows: dict[str, dict[str, Any]] = {}
    for status in statuses:
        rule = status.job.rule
        row = rows.setdefault(
            rule,
            {
                "family": status.family,
                "rule": rule,
                "jobs": 0,
                **dict.fromkeys(STATES, 0),
                **dict.fromkeys(HOURS, 0.0),
            },
        )
        row["jobs"] += 1
        row[status.state] += 1
        for key in HOURS:
            row[key] += getattr(status, key)
    order = {name: index for index, name in enumerate(rule_order)}
    return sorted(rows.values(), key=lambda r: (r["family"], order.get(r["rule"], 0), r["rule"]))


def job_entry(status: JobStatus, now: float) -> dict[str, Any]:
    """A running, failed or incomplete job as listed in the JSON."""
    entry: dict[str, Any] = {
        "rule": status.job.rule,
        "wildcards": status.job.wildcards,
        "output": status.job.output,
        "slurm_id": status.slurm.job_id if status.slurm else None,
        "slurm_state": status.slurm.state if status.slurm else None,
    }
    if status.state == "running":
        entry["started"] = status.started
        entry["progress"] = status.progress.as_dict(now) if status.progress else None
    if status.state == "failed":
        entry["log"] = status.log
        entry["last_line"] = status.last_line
    return entry


def as_dict(statuses: list[JobStatus], rule_order: list[str], seen: Seen) -> dict[str, Any]:
    """The whole status (see docs/status.md, section `--json`)."""
    rows = rule_rows(statuses, rule_order)
    totals = {key: sum(r[key] for r in rows) for key in ("jobs", *STATES, *HOURS)}
    return {
        "directory": str(seen.directory),
        "time": seen.now,
        "run_active": seen.run_active,
        "persistence_backend": seen.backend,
        "stale_lock": seen.stale_lock,
        "slurm_unreachable": seen.slurm_unreachable,
        "totals": totals,
        "rules": rows,
        **{
            state: [job_entry(s, seen.now) for s in statuses if s.state == state]
            for state in ("running", "failed", "incomplete")
        },
    }


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return "ETA ?"
    if seconds < 120:
        return f"ETA {seconds:.0f} s"
    return f"ETA {seconds / 60:.0f} min" if seconds < 7200 else f"ETA {seconds / 3600:.1f} h"


def _name(entry: dict[str, Any]) -> str:
    values = ",".join(f"{k}={v}" for k, v in entry["wildcards"].items())
    return f"{entry['rule']}[{values}]" if values else entry["rule"]


def render(status: dict[str, Any], seconds: float) -> str:
    """Tables: jobs per family and rule, then the running, failed and incomplete jobs."""
    header = (
        f"{'family':<9} {'rule':<26} {'jobs':>5} {'done':>5} {'run':>4} {'queue':>5} "
        f"{'fail':>4} {'incpl':>5} {'todo':>5} {'h left':>7} {'GPU-h used':>10} {'GPU-h left':>10}"
    )
    lines = [header, "-" * len(header)]
    for row in [*status["rules"], {"family": "total", "rule": "", **status["totals"]}]:
        if row["family"] == "total":
            lines.append("-" * len(header))
        lines.append(
            f"{row['family']:<9} {row['rule']:<26} {row['jobs']:>5} {row['done']:>5} "
            f"{row['running']:>4} {row['queued']:>5} {row['failed']:>4} {row['incomplete']:>5} "
            f"{row['todo']:>5} {hours(row['hours_left']):>7} {hours(row['gpu_h_spent']):>10} "
            f"{hours(row['gpu_h_left']):>10}"
        )
    for entry in status["running"]:
        slurm = f" SLURM {entry['slurm_id']}" if entry["slurm_id"] else ""
        progress = entry["progress"]
        where = (
            f"{progress['done']:g}/{progress['total']:g} {progress['unit']}, "
            f"{_eta(progress['eta_s'])}"
            if progress
            else "no progress file"
        )
        lines.append(f"running   {_name(entry)}{slurm}: {where}")
    for entry in status["failed"]:
        slurm = f" SLURM {entry['slurm_id']} {entry['slurm_state']}" if entry["slurm_id"] else ""
        lines.append(f"FAILED    {_name(entry)}{slurm}: {entry['log']}")
        lines.append(f"          {entry['last_line']}")
    for entry in status["incomplete"]:
        lines.append(f"incomplete {_name(entry)}: left by a killed run or job; a re-run redoes it")
    if status["stale_lock"]:
        lines.append(
            "stale lock: a killed run left Snakemake's lock here and the next run stops on it;"
            f" remove it with: {status['stale_lock']}"
        )
    if status["slurm_unreachable"]:
        lines.append(
            f"SLURM controller unreachable ({status['slurm_unreachable']}): SLURM jobs' states"
            " not read; states from job records and Snakemake's records"
        )
    state = "a run is active" if status["run_active"] else "no run active"
    stamp = time.strftime("%H:%M:%S", time.localtime(status["time"]))
    lines.append(f"{stamp}: {state} in {status['directory']}; status read in {seconds:.1f} s.")
    return "\n".join(lines)
