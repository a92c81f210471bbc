"""Each job's state (done, running, queued, failed, incomplete, todo), progress and GPU-hours."""

from __future__ import annotations

import os
import re
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuflow.cost.benchmarks import benchmark_seconds, earlier_attempts_s
from gpuflow.cost.expected import Expected
from gpuflow.job.outputlock import SINCE_FORMAT, lock_path, read_holder
from gpuflow.job.record import STARTED, record_of
from gpuflow.ops.plan import Job
from gpuflow.ops.snakemake_adapter import Dag, FailedJob, Marker
from gpuflow.ops.status.progress import Progress, job_progress
from gpuflow.slurm.queue import ENDED_BADLY, QUEUED, RUNNING, SlurmJob, job_comment

STATES = ("done", "running", "queued", "failed", "incomplete", "todo")


@dataclass
class Seen:
    """What Snakemake's records and SLURM say about the run as a whole."""

    directory: Path
    markers: dict[str, Marker]
    slurm: dict[str, SlurmJob]
    failed: list[FailedJob]
    run_active: bool
    run_started: float | None = None
    times: dict[str, tuple[float, float]] = field(default_factory=dict)
    stale_lock: str | None = None
    backend: str = "file"
    slurm_unreachable: str | None = None
    now: float = field(default_factory=time.time)


@dataclass
class JobStatus:
    """One job's state and what status shows about it."""

    job: Job
    state: str
    family: str
    slurm: SlurmJob | None = None
    started: float | None = None
    progress: Progress | None = None
    log: str | None = None
    last_line: str = ""
    hours_left: float = 0.0
    gpu_h_spent: float = 0.0
    gpu_h_left: float = 0.0


def local_holder_alive(output: Path) -> float | None:
    """When the live local process holding `output`'s writer lock took it, else None."""
    fields = read_holder(output)
    if fields is None:
        return None
    if fields.get("host") != socket.gethostname() or not fields.get("pid", "").isdigit():
        return None
    try:
        os.kill(int(fields["pid"]), 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    try:
        return time.mktime(time.strptime(fields.get("since", ""), SINCE_FORMAT))
    except ValueError:
        return lock_path(output).stat().st_mtime


def recorded_failure(outputs: list[Path], seen: Seen) -> str | None:
    """The error of a job whose record says its last attempt failed or never ended, else None."""
    record = record_of(outputs)
    status = record.get("status")
    if status == STARTED:
        if record.get("host") != socket.gethostname():
            return None
        status, since = KILLED, record.get("started")
    elif isinstance(status, str) and status.startswith("failed"):
        since = record.get("ended")
    else:
        return None
    if seen.run_active and not (
        seen.run_started is not None
        and isinstance(since, int | float)
        and since >= seen.run_started
    ):
        return None
    error = record.get("error")
    return f"{status}: {error}" if isinstance(error, str) and error else status


def step_started(outputs: list[Path], marker: Marker) -> bool:
    """Whether the job record of `outputs` says their step started since Snakemake marked them."""
    record = record_of(outputs)
    since = record.get("started")
    return (
        record.get("status") == STARTED
        and isinstance(since, int | float)
        and since >= marker.started - 1
    )


# What status says of a job whose record was written when it started and never again.
KILLED = "failed (killed: its job record was never ended)"


def classify(job: Job, seen: Seen) -> JobStatus:
    """The state of one job (docs/status.md, design notes: the order of the checks)."""
    root = seen.directory
    paths = [root / o for o in job.output]
    marker = next((seen.markers[o] for o in job.output if o in seen.markers), None)
    slurm = seen.slurm.get(job_comment(job.rule, job.wildcards.values()))
    # the family: the part of the rule's name before the first '_'
    status = JobStatus(job, "todo", job.rule.split("_", 1)[0], slurm=slurm)
    held = next((t for t in map(local_holder_alive, paths) if t is not None), None)
    ours = (
        r for r in reversed(seen.failed) if r.rule == job.rule and set(job.output) & set(r.output)
    )
    report = next(ours, None)
    recorded: str | None = None
    ended_badly = slurm is not None and slurm.state in ENDED_BADLY
    if slurm is not None and slurm.state in RUNNING:
        status.state = "running"
    elif slurm is not None and slurm.state in QUEUED:
        status.state = "queued"
    elif held is not None:
        status.state = "running"
    elif marker is None and paths and all(p.exists() for p in paths):
        status.state = "done"
    elif (
        (marker is None and paths and (recorded := recorded_failure(paths, seen)))
        or report is not None
        or ended_badly
    ):
        status.state = "failed"
        logs = report.log if report is not None else job.log
        status.log, status.last_line = last_error_line(logs or job.log, root)
        if (recorded == KILLED and not ended_badly) or not status.last_line:
            # a killed step's log ends wherever the kill found it: the record says what happened
            status.last_line = recorded or (report.message if report is not None else "")
    elif marker is not None:
        # A marker older than the active run was left by a killed one (the run redoes it later).
        this_run = seen.run_started is not None and marker.started >= seen.run_started - 1
        if not this_run:
            status.state = "incomplete"
        elif marker.external_jobid is None:
            status.state = "running"
        elif seen.slurm_unreachable:
            status.state = "running" if step_started(paths, marker) else "queued"
        else:
            status.state = "incomplete"  # SLURM no longer knows the job the run submitted
    elif seen.run_active:
        status.state = "queued"
    if status.state == "running":
        status.started = slurm_time(slurm.started if slurm else "") or (
            marker.started if marker else held
        )
    return status


ERROR_WORDS = re.compile(r"error|exception|traceback|killed|cancelled|failed", re.IGNORECASE)
# the line a gpuflow step ends on when it fails or is stopped (gpuflow.cli)
GPUFLOW_ERROR = re.compile(r"\bgpuflow [\w-]+: error: ")


def last_error_line(paths: list[str], directory: str | Path) -> tuple[str | None, str]:
    """(log path, its line naming the error) of the first readable log."""
    for name in paths:
        try:
            text = (Path(directory) / name).read_text(encoding="utf-8", errors="replace")
            lines = [line.strip() for line in text.splitlines() if line.strip()]
        except OSError:
            continue
        own = [line for line in lines if GPUFLOW_ERROR.search(line)]
        errors = [line for line in lines if ERROR_WORDS.search(line)]
        return name, (own or errors or lines or [""])[-1]
    return (paths[0] if paths else None), ""


def slurm_time(text: str) -> float | None:
    """A time as SLURM prints it (2026-11-23T07:28:52, local time), None for N/A, Unknown."""
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def job_hours(status: JobStatus, seen: Seen) -> float:
    """Wall hours a finished job ran: from SLURM, else its benchmark, else Snakemake's times."""
    if status.slurm is not None:
        start, end = slurm_time(status.slurm.started), slurm_time(status.slurm.ended)
        if start is not None and end is not None:
            return max(end - start, 0.0) / 3600
    if status.job.benchmark:
        seconds = benchmark_seconds(seen.directory / status.job.benchmark)
        if seconds is not None:
            return seconds / 3600
    times = seen.times.get(status.job.output[0])
    return max(times[1] - times[0], 0.0) / 3600 if times else 0.0


def telemetry_gpu_hours(record: dict[str, Any]) -> float | None:
    """GPU-hours a job's record (its telemetry) holds, if it saw its GPUs (NVML answered)."""
    gpu = record.get("gpu") or {}
    return float(gpu["gpu_hours"]) if gpu.get("count") else None


def account(status: JobStatus, seen: Seen, expected: Expected) -> None:
    """Progress of a running job; GPU-hours spent; job-hours and GPU-hours still expected."""
    job, gpus = status.job, status.job.gpus
    if status.state == "running":
        started = status.started or seen.now
        status.progress = job_progress(job, seen.directory)
        status.gpu_h_spent = gpus * max(seen.now - started, 0.0) / 3600
    elif status.state == "done" and gpus:
        record = record_of(seen.directory / output for output in job.output)
        measured = telemetry_gpu_hours(record)
        status.gpu_h_spent = gpus * job_hours(status, seen) if measured is None else measured
        status.gpu_h_spent += gpus * earlier_attempts_s(record) / 3600
    if status.state != "done":
        eta = status.progress.eta_s(seen.now) if status.progress else None
        if eta is not None:
            status.hours_left = eta / 3600
        else:
            elapsed = seen.now - status.started if status.started else 0.0
            status.hours_left = max(expected.predict(job).seconds / 3600 - elapsed / 3600, 0.0)
        status.gpu_h_left = gpus * status.hours_left


def collect(planned: Dag, seen: Seen, expected: Expected) -> list[JobStatus]:
    """The status of every job with outputs; `expected` times the jobs not yet running."""
    statuses = []
    for job in planned.jobs:
        if not job.output:
            continue
        status = classify(job, seen)
        account(status, seen, expected)
        statuses.append(status)
    return statuses
