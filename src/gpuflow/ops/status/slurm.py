"""SLURM's view of a run's jobs: squeue (pending and running), sacct where a database exists.

Jobs are matched as `gpuflow.slurm_site.earlier_jobs` does: job name prefix `gpuflow_`, the same
working directory, and the comment the executor plugin gives (rule and wildcard values).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gpuflow.slurm_site import JOB_NAME_PREFIX


@dataclass(frozen=True)
class SlurmJob:
    """A SLURM job of this run: id, state (RUNNING, PENDING, FAILED, ...), comment, start, end."""

    job_id: str
    comment: str
    state: str
    started: str = ""
    ended: str = ""


def _run(command: list[str]) -> str | None:
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout if result.returncode == 0 else None


def _jobs_of(out: str | None, workdir: str | Path) -> list[SlurmJob]:
    """gpuflow jobs of `workdir` in `out`: lines of id|name|comment|state|workdir|start|end."""
    here = os.path.realpath(workdir)
    jobs = []
    for line in (out or "").splitlines():
        fields = line.split("|")
        if len(fields) != 7:
            continue
        job_id, name, comment, state, directory, started, ended = fields
        if name.startswith(JOB_NAME_PREFIX) and os.path.realpath(directory) == here:
            jobs.append(SlurmJob(job_id, comment, state.split()[0], started, ended))
    return jobs


def squeue_jobs(workdir: str | Path) -> list[SlurmJob]:
    """This user's gpuflow jobs submitted from `workdir` that squeue still lists."""
    if shutil.which("squeue") is None:
        return []
    out = _run(["squeue", "--me", "--states=all", "--noheader", "--format=%i|%j|%k|%T|%Z|%S|%e"])
    return _jobs_of(out, workdir)


def sacct_jobs(workdir: str | Path) -> list[SlurmJob]:
    """Jobs SLURM's accounting database holds for `workdir` (none where there is no database)."""
    if shutil.which("sacct") is None:
        return []
    out = _run(
        [
            "sacct",
            "--noheader",
            "--parsable2",
            "--allocations",
            "--starttime=now-7days",
            "--format=JobID,JobName,Comment,State,WorkDir,Start,End",
        ]
    )
    return _jobs_of(out, workdir)


def run_jobs(workdir: str | Path) -> dict[str, SlurmJob]:
    """The newest SLURM job of each comment (rule and wildcards): sacct, then squeue over it."""
    found: dict[str, SlurmJob] = {}
    for job in [*sacct_jobs(workdir), *squeue_jobs(workdir)]:
        known = found.get(job.comment)
        if known is None or _number(job.job_id) >= _number(known.job_id):
            found[job.comment] = job
    return found


def _number(job_id: str) -> int:
    digits = job_id.split("_")[0].split(".")[0]
    return int(digits) if digits.isdigit() else -1
