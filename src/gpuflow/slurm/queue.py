"""The jobs SLURM lists for a run: squeue (pending, running, recently ended) and sacct."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass, replace
from pathlib import Path

JOB_NAME_PREFIX = "gpuflow_"
SQUEUE_TEXT = ["squeue", "--me", "--states=all", "--noheader", "--format=%i|%j|%k|%T|%Z|%S|%e"]
# without --allocations both list each job's steps (<id>.batch, <id>.0, ...)
SACCT_TEXT = ["sacct", "--noheader", "--parsable2", "--starttime=now-7days"]
SACCT_TEXT += ["--format=JobID,JobName,Comment,State,WorkDir,Start,End"]
TIMEOUT_S = 30.0
# squeue's and sacct's each under `gpuflow status`, which answers within 5 s (1 to 2 s its own)
STATUS_TIMEOUT_S = 2.0
# what a SLURM command prints when it could not reach slurmctld (after retrying)
CONTROLLER_DOWN = "Unable to contact slurm controller"
NO_VALUE = {"", "(null)", "None", "NONE", "N/A", "Unknown"}
RUNNING = {"RUNNING", "COMPLETING", "CONFIGURING", "SIGNALING", "STAGE_OUT"}
QUEUED = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SUSPENDED"}
ACTIVE = RUNNING | QUEUED
ENDED_BADLY = {
    "FAILED",
    "TIMEOUT",
    "CANCELLED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
}

# One row per allocation (job or retry), for what a run spent (gpuflow ledger).
SACCT_ALLOCATIONS = ["sacct", "-X", "--noheader", "--parsable2", "--starttime=now-30days"]
SACCT_ALLOCATIONS += ["--format=JobID,JobName,Comment,WorkDir,Partition,ElapsedRaw,AllocTRES"]


class Unreachable(Exception):
    """A SLURM command got no answer: past its timeout, or no contact with the controller."""


@dataclass(frozen=True)
class SlurmJob:
    """One SLURM job: id, comment, state, name, working directory, start and end."""

    job_id: str
    comment: str
    state: str
    name: str = ""
    workdir: str = ""
    started: str = ""
    ended: str = ""

    @property
    def active(self) -> bool:
        """SLURM still holds the job: queued, running or ending."""
        return self.state in ACTIVE


def job_comment(rule: str, wildcard_values: Iterable[str]) -> str:
    """The comment the SLURM executor plugin gives a job of `rule` (rule_<rule>_wildcards_...)."""
    values = "_".join(str(v) for v in wildcard_values).replace("/", "_")
    return f"rule_{rule}_wildcards_{values}" if values else f"rule_{rule}"


def parse_text(out: str) -> list[SlurmJob]:
    """Jobs in squeue's or sacct's delimited lines of id|name|comment|state|workdir|start|end."""
    jobs = []
    for line in out.splitlines():
        fields = line.split("|")
        if len(fields) != 7:
            continue
        job_id, name, comment, state, workdir, started, ended = (_value(f) for f in fields)
        state = state.split(" ")[0]
        ended = "" if state in ACTIVE else ended  # an active job's end is its time limit's
        jobs.append(SlurmJob(job_id, comment, state, name, workdir, started, ended))
    return jobs


def parse_sacct_text(out: str) -> list[SlurmJob]:
    """The jobs in sacct's lines, each job's step lines folded into its state."""
    lines = parse_text(out)
    steps: dict[str, list[str]] = {}
    for line in lines:
        job_id, dot, _ = line.job_id.partition(".")
        if dot:
            steps.setdefault(job_id, []).append(line.state)
    return [
        replace(job, state=_memory_failure(job.state, steps.get(job.job_id, [])))
        for job in lines
        if "." not in job.job_id
    ]


def _memory_failure(state: str, step_states: list[str]) -> str:
    """OUT_OF_MEMORY for a job that failed because a step ran out of memory."""
    return "OUT_OF_MEMORY" if state == "FAILED" and "OUT_OF_MEMORY" in step_states else state


@dataclass(frozen=True)
class Allocation:
    """What one SLURM job of a run held: comment, partition, seconds, GPUs and billing."""

    job_id: str
    comment: str
    partition: str
    elapsed_s: float
    gpus: int
    billing: float


def allocations(workdir: str | Path) -> list[Allocation]:
    """Every allocation of the run in `workdir` that SLURM's accounting holds."""
    here = os.path.realpath(workdir)
    try:
        out = _run(SACCT_ALLOCATIONS) or ""
    except Unreachable:
        return []
    found = []
    for line in out.splitlines():
        fields = line.split("|")
        if len(fields) != 7 or not fields[5].isdigit():
            continue
        job_id, name, comment, folder, partition, elapsed, tres = fields
        held = dict(part.split("=", 1) for part in tres.split(",") if "=" in part)
        gpus = int(held.get("gres/gpu", "0").split("(")[0] or 0)
        billing = float(held.get("billing", "0") or 0)
        allocation = Allocation(job_id, _value(comment), partition, float(elapsed), gpus, billing)
        if name.startswith(JOB_NAME_PREFIX) and os.path.realpath(folder) == here:
            found.append(allocation)
    return found


def squeue_jobs(workdir: str | Path, timeout: float = TIMEOUT_S) -> list[SlurmJob]:
    """This user's gpuflow jobs from `workdir` that squeue still lists."""
    try:
        return _squeue(workdir, timeout)
    except Unreachable:
        return []


def sacct_jobs(workdir: str | Path, timeout: float = TIMEOUT_S) -> list[SlurmJob]:
    """Jobs SLURM's accounting database holds for `workdir`."""
    try:
        return _of_run(parse_sacct_text(_run(SACCT_TEXT, timeout) or ""), workdir)
    except Unreachable:
        return []


def status_jobs(
    workdir: str | Path, timeout: float = STATUS_TIMEOUT_S
) -> tuple[dict[str, SlurmJob], str | None]:
    """`gpuflow status`'s view of a run's SLURM jobs: (newest per comment, None) or ({}, why)."""
    try:
        queued = _squeue(workdir, timeout)
    except Unreachable as error:
        return {}, str(error)
    return _newest([*sacct_jobs(workdir, timeout), *queued]), None


def _squeue(workdir: str | Path, timeout: float) -> list[SlurmJob]:
    return _of_run(parse_text(_run(SQUEUE_TEXT, timeout) or ""), workdir)


def _newest(jobs: list[SlurmJob]) -> dict[str, SlurmJob]:
    """The newest job of each comment, a later job of the same id replacing it while active."""
    found: dict[str, SlurmJob] = {}
    for job in jobs:
        known = found.get(job.comment)
        same = known is not None and _number(job.job_id) == _number(known.job_id)
        if known is None or _number(job.job_id) > _number(known.job_id) or (same and job.active):
            found[job.comment] = job
    return found


def _run(command: list[str], timeout: float = TIMEOUT_S) -> str | None:
    """A command's output; None where it failed; Unreachable past `timeout` or no controller."""
    try:
        child = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
    except OSError:
        return None
    with child:
        try:
            out, err = child.communicate(timeout=timeout)
        except BaseException as error:
            with suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            if isinstance(error, subprocess.TimeoutExpired):
                raise Unreachable(f"{command[0]}: no answer in {timeout:g} s") from None
            raise
    if child.returncode == 0:
        return out
    down = [line for line in err.splitlines() if CONTROLLER_DOWN.lower() in line.lower()]
    if down:
        raise Unreachable(f"{command[0]}: {down[-1].split('error: ', 1)[-1].strip()}")
    return None


def _of_run(jobs: list[SlurmJob], workdir: str | Path) -> list[SlurmJob]:
    here = os.path.realpath(workdir)
    return [
        job
        for job in jobs
        if job.name.startswith(JOB_NAME_PREFIX) and os.path.realpath(job.workdir) == here
    ]


def _value(field: str) -> str:
    return "" if field in NO_VALUE else field


def _number(job_id: str) -> int:
    digits = job_id.split("_")[0].split(".")[0]
    return int(digits) if digits.isdigit() else -1
