"""Jobs that fit no partition of the site file, found before anything is submitted."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from math import isinf
from pathlib import Path
from typing import Any

from gpuflow.errors import GpuflowError

# What a job asks for (its resources) against the partition limit that caps it.
LIMITS = {
    "gpu": "max_gpu",
    "cpus_per_gpu": "max_cpus_per_gpu",
    "cpus_per_task": "max_cpus_per_task",
    "mem_mb": "max_mem_mb",
    "runtime": "max_runtime",
    "nodes": "max_nodes",
}


@dataclass(frozen=True)
class PlannedJob:
    """What the plugin reads of a job: its rule (as `name`), resources and threads."""

    name: str
    resources: Mapping[str, Any]
    threads: int
    wildcards: Mapping[str, str] = field(default_factory=dict)


def read_partitions(site_file: str | Path) -> list[Any]:
    """The site file's partitions as the plugin reads them."""
    from snakemake_executor_plugin_gpuflow_slurm import read_partitions

    return read_partitions(Path(site_file))


def partition_of(job: PlannedJob, partitions: list[Any]) -> str | None:
    """The partition the plugin sends `job` to, or None (the cluster's default)."""
    named = job.resources.get("slurm_partition")
    if named:
        return str(named)
    scored = [(p.score_job_fit(job), p.name) for p in partitions]
    fitting = [(score, name) for score, name in scored if score is not None]
    return max(fitting)[1] if fitting else None


def asks(job: PlannedJob) -> str:
    """What the job asks for, in the site file's terms (e.g. 'gpu 8, mem_mb 64000')."""
    gpus = _gpus(job)
    parts = [f"gpu {gpus}"] if gpus else []
    parts += [
        f"{key} {job.resources[key]}" for key in LIMITS if key != "gpu" and key in job.resources
    ]
    return ", ".join(parts)


def exceeded(job: PlannedJob, partition: Any) -> str:
    """The limits of `partition` the job exceeds, e.g. 'max_gpu 4'."""
    over = []
    for key, limit_name in LIMITS.items():
        limit = getattr(partition.limits, limit_name)
        wanted = _gpus(job) if key == "gpu" else job.resources.get(key)
        if isinstance(wanted, (int, float)) and not isinf(limit) and wanted > limit:
            over.append(f"{limit_name} {limit:g}")
    return ", ".join(over) or "its GPU models, constraints or cluster"


def unfit_report(jobs: Iterable[PlannedJob], site_file: str | Path) -> str | None:
    """Every rule with a job that fits no partition of the site file, and why; else None."""
    partitions = read_partitions(site_file)
    unfit: dict[str, PlannedJob] = {}
    for job in jobs:
        if job.name not in unfit and all(p.score_job_fit(job) is None for p in partitions):
            unfit[job.name] = job
    if not unfit:
        return None
    lines = [f"{len(unfit)} rule(s) ask for more than any partition of {site_file} gives:"]
    for job in unfit.values():
        values = ", ".join(f"{name}={value}" for name, value in job.wildcards.items())
        where = f" ({values})" if values else ""
        limits = "; ".join(f"{p.name}: {exceeded(job, p)}" for p in partitions)
        lines.append(f"  {job.name}{where} asks {asks(job)}; {limits}")
    lines.append(
        "The SLURM plugin would send these jobs to the cluster's default partition. Lower the "
        "rule's resources in the config, or add a partition that has them to the site file."
    )
    return "\n".join(lines)


def check_jobs_fit(jobs: Iterable[PlannedJob], site_file: str | Path) -> None:
    """Raise GpuflowError with the unfit_report where a job fits no partition."""
    report = unfit_report(jobs, site_file)
    if report:
        raise GpuflowError(report)


def _gpus(job: PlannedJob) -> int:
    """GPUs per node, as the plugin counts them (`gpu`, else the count in `gres`)."""
    from snakemake_executor_plugin_gpuflow_slurm import gpus_per_node

    return gpus_per_node(job)


# A retry's resources grow up to the partition limit of the same name.
RETRY_LIMITS = {"mem_mb": "max_mem_mb", "runtime": "max_runtime"}


@cache
def retry_limits(site_file: str | Path, gpu: bool) -> dict[str, float]:
    """The largest `max_mem_mb` and `max_runtime` of the partitions for a job of this kind."""
    partitions = read_partitions(site_file)
    kind = [p for p in partitions if (p.limits.max_gpu > 0) == gpu]
    chosen = kind if kind or gpu else partitions
    limits: dict[str, float] = {}
    for resource, limit_name in RETRY_LIMITS.items():
        values = [getattr(p.limits, limit_name) for p in chosen]
        if values and not any(isinf(value) for value in values):
            limits[resource] = max(values)
    return limits


def grown(first: float, attempt: int, limit: float | None) -> int:
    """What attempt `attempt` of a job asks for: `first` x attempt, within [first, limit]."""
    wanted = first * attempt
    if limit is not None:
        wanted = max(first, min(wanted, limit))
    return int(wanted)
