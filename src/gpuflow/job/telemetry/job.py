"""One sampler per job, started by the job context (`gpuflow.job`) around the step."""

from __future__ import annotations

import os
from typing import Any

from gpuflow.job.telemetry.sampler import Sampler

STARTED = "running"  # a job's status from its start until it ends (its record says so too)


class JobTelemetry:
    """The running job's sampler, its status and the timings its step noted."""

    active: JobTelemetry | None = None

    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler
        self.status = STARTED
        self.timings: dict[str, float] = {}

    def finish(self, code: int) -> int:
        """Mark the step's exit status; returns it."""
        self.status = "finished" if code == 0 else f"failed (exit status {code})"
        return code

    def summary(self) -> dict[str, Any]:
        return {"status": self.status, **self.sampler.summary(), "timings": dict(self.timings)}


def job_gpus(environ: dict[str, str] | None = None) -> str | None:
    """The job's GPUs for NVML: CUDA_VISIBLE_DEVICES; None (every GPU) only outside a SLURM job
    and a GPU rule, as by hand on a workstation. A SLURM job without GPUs, or a rule asking for
    none (GPUFLOW_GPUS=0), has none (''), though NVML may see the node's GPUs."""
    env = os.environ if environ is None else environ
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return visible
    if env.get("GPUFLOW_GPUS") == "0":
        return ""
    if "SLURM_JOB_ID" in env and not (env.get("SLURM_JOB_GPUS") or env.get("SLURM_STEP_GPUS")):
        return ""
    return None


def tree_root() -> int:
    """The process whose tree is sampled: torchrun's agent under torchrun, else this one."""
    return os.getppid() if "LOCAL_RANK" in os.environ else os.getpid()


def node_count() -> int:
    """Nodes of this SLURM job (1 outside one)."""
    nodes = os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES") or "1"
    return int(nodes) if nodes.isdigit() else 1


def current() -> dict[str, Any] | None:
    """The running job's telemetry so far (for its run record), or None where none samples."""
    if JobTelemetry.active is None:
        return None
    JobTelemetry.active.sampler.sample_processes()
    return JobTelemetry.active.summary()


def note(**timings: float) -> None:
    """Record the step's own timings (data_wait_s, comm_exposed_s, step_s, batch_size...)."""
    if JobTelemetry.active is not None:
        JobTelemetry.active.timings.update({k: float(v) for k, v in timings.items()})
