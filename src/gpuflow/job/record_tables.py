"""Job records as tables: one row per job for the family reports, per rule for the plan."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from gpuflow.job.markdown import markdown_table
from gpuflow.job.paths import RECORD, family_root, job_of
from gpuflow.job.record import ended, read_record
from gpuflow.job.telemetry.flags import flag, utilisation


def read_folder(folder: str | Path) -> dict[str, dict[str, Any]]:
    """Every ended job's record under `folder`, by job (its first output)."""
    found = {}
    for path in sorted(Path(folder).rglob(f"*.{RECORD}")):
        job = job_of(path.relative_to(folder), RECORD)
        summary = read_record(path) if job is not None else None
        if summary is not None and ended(summary):
            found[job] = summary
    return found


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} MB"


def job_row(job: str, summary: dict[str, Any], threshold: float) -> list[str]:
    """job, status, wall, GPU-hours, utilisation, peak memory, CPU util, peak RSS, flag."""
    kind, util = utilisation(summary)
    gpu, cpu = summary.get("gpu") or {}, summary.get("cpu") or {}
    return [
        job,
        str(summary.get("status", "?")),
        f"{summary.get('wall_s', 0.0):.1f} s",
        f"{gpu.get('gpu_hours', 0.0):.4f}",
        f"{_pct(util)} {kind}",
        _mb(gpu.get("memory_used_peak_mb")) if gpu.get("count") else "-",
        f"{_pct(cpu.get('util_percent_mean'))} of {cpu.get('allotted_cores', '?')}",
        _mb(cpu.get("peak_rss_mb")),
        flag(summary, threshold) or "ok",
    ]


JOB_HEADER = [
    "job",
    "status",
    "wall",
    "GPU-h",
    "utilisation",
    "GPU mem peak",
    "CPU util (cores)",
    "peak RSS",
    "flag",
]


def jobs_section(folder: str | Path, threshold: float) -> str:
    """The report section: GPU-hours and utilisation of every job under `folder`, flagged."""
    jobs = read_folder(folder)
    if not jobs:
        return f"## Jobs: devices used\n\nNo job records under {folder}.\n"
    rows = [job_row(name, summary, threshold) for name, summary in jobs.items()]
    total = sum((s.get("gpu") or {}).get("gpu_hours", 0.0) for s in jobs.values())
    absent = {(s.get("gpu") or {}).get("absent") for s in jobs.values()} - {None}
    flagged = sum(1 for row in rows if row[-1] != "ok")
    lines = [
        "## Jobs: devices used",
        "",
        f"{len(rows)} jobs, {total:.4f} GPU-hours; {flagged} below {threshold:g}% utilisation"
        " (GPU SM utilisation; on CPU, share of the allotted cores busy).",
    ]
    if absent:
        lines.append(f"No GPU telemetry: {'; '.join(sorted(absent))}.")
    return "\n".join([*lines, "", markdown_table(JOB_HEADER, rows, bar="/"), ""])


def section(out: str | Path) -> str:
    """The markdown section on the job records of the family that report `out` belongs to."""
    from gpuflow.job import current

    threshold = float(current().settings["low_utilisation_percent"])
    return "\n" + jobs_section(family_root(out), threshold)


def rule_summary(summaries: list[dict[str, Any]], threshold: float) -> dict[str, Any]:
    """Earlier jobs of one rule: count, GPU-hours used, mean utilisation and the flag."""
    utils = [(kind, u) for kind, u in map(utilisation, summaries) if u is not None]
    kinds = {kind for kind, _ in utils}
    mean = sum(u for _, u in utils) / len(utils) if utils else None
    flags = [flag(s, threshold) for s in summaries]
    low = [f for f in flags if f] or ["LOW"]
    return {
        "jobs_measured": len(summaries),
        "gpu_h_used": sum((s.get("gpu") or {}).get("gpu_hours", 0.0) for s in summaries),
        "util_mean": mean,
        "util_kind": "/".join(sorted(kinds)) or "-",
        "flag": Counter(low).most_common(1)[0][0] if mean is not None and mean < threshold else "",
    }
