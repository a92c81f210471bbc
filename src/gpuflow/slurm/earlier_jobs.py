"""Refuse a SLURM run while an earlier run's jobs still work on its targets."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from gpuflow.errors import GpuflowError
from gpuflow.slurm.queue import SlurmJob, job_comment, squeue_jobs


def earlier_jobs(workdir: str | Path) -> list[SlurmJob]:
    """Pending or running jobs of this user that a gpuflow run submitted from `workdir`."""
    return [job for job in squeue_jobs(workdir) if job.active]


def check_no_earlier_jobs(planned: Iterable[tuple[str, Iterable[str]]], workdir: str) -> None:
    """Refuse to submit a job that an earlier run's SLURM job is still running or queued for."""
    running = {job.comment: job for job in earlier_jobs(workdir)}
    clashes = [
        running[comment]
        for comment in {job_comment(rule, values) for rule, values in planned}
        if comment in running
    ]
    if clashes:
        clashes.sort(key=lambda job: job.job_id)
        listed = ", ".join(f"{job.job_id} ({job.comment}, {job.state})" for job in clashes)
        ids = " ".join(job.job_id for job in clashes)
        raise GpuflowError(
            f"{len(clashes)} SLURM job(s) of an earlier run still write targets of this run: "
            f"{listed}. Wait for them (squeue --me) or end them with: scancel {ids}"
        )
