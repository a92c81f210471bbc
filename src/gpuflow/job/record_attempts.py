"""A job record's attempts: every start of the job's step, kept across requeues and retries."""

from __future__ import annotations

import os
from typing import Any

from gpuflow.job.telemetry.job import STARTED

# An attempt whose record still said "running" when a later attempt started: killed (SIGKILL,
# the out-of-memory killer, a node lost) or superseded before it could write its end.
NO_END = "no end recorded"
FINISHED = "finished"


def restart_count(slurm_job: str | None, earlier: list[dict[str, Any]]) -> int:
    """How often SLURM has requeued this job in place: SLURM_RESTART_COUNT where the step sees
    it (Snakemake's SLURM job-step executor drops it from the step's environment), else the
    attempts before this one in the same SLURM job; 0 outside SLURM."""
    count = os.environ.get("SLURM_RESTART_COUNT", "")
    if count.isdigit():
        return int(count)
    return sum(1 for a in earlier if slurm_job and a.get("slurm_job_id") == slurm_job)


def visible_gpus(visible: str | None) -> list[dict[str, Any]]:
    """The GPUs CUDA_VISIBLE_DEVICES names (gpuflow.job.telemetry.job.job_gpus), by label."""
    labels = [part.strip() for part in (visible or "").split(",") if part.strip()]
    return [{"device": label, "uuid": None} for label in labels]


def measured_gpus(gpu_summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The GPUs NVML sampled for the job (its telemetry's `gpu` part): label and UUID."""
    devices = gpu_summary.get("devices") if isinstance(gpu_summary, dict) else None
    return [
        {"device": str(d.get("device")), "uuid": d.get("uuid")}
        for d in devices or []
        if isinstance(d, dict)
    ]


def attempt_entry(
    identity: dict[str, Any], gpus: list[dict[str, Any]], earlier: list[dict[str, Any]]
) -> dict[str, Any]:
    """This attempt as it starts, after the `earlier` ones: when, where (host, SLURM node,
    GPUs), which SLURM job and restart."""
    return {
        "started": identity["started"],
        "ended": None,
        "status": STARTED,
        "host": identity["host"],
        "node": os.environ.get("SLURMD_NODENAME"),
        "gpus": gpus,
        "slurm_job_id": identity["slurm_job_id"],
        "restart": restart_count(identity["slurm_job_id"], earlier),
    }


def recorded_attempts(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The attempts a record holds; a record of an older gpuflow (no `attempts`) holds one, its
    own, from its top-level fields."""
    attempts = record.get("attempts")
    if isinstance(attempts, list):
        return [a for a in attempts if isinstance(a, dict)]
    if not isinstance(record.get("started"), int | float):
        return []
    return [
        {
            "started": record["started"],
            "ended": record.get("ended"),
            "status": record.get("status", STARTED),
            "host": record.get("host"),
            "gpus": measured_gpus(record.get("gpu") or {}),
            "slurm_job_id": record.get("slurm_job_id"),
            "restart": None,
        }
    ]


def earlier_attempts(record: dict[str, Any] | None, state_kept: bool) -> list[dict[str, Any]]:
    """The attempts of the job's record as it was before this attempt started, which this one
    continues: none where the last one finished and the job keeps no resume state or progress
    (`state_kept`), since then this is the job run again (its outputs made anew), not another
    attempt at the same outputs. An earlier attempt still "running" gets NO_END."""
    attempts = recorded_attempts(record or {})
    if not attempts or (attempts[-1].get("status") == FINISHED and not state_kept):
        return []
    return [{**a, "status": NO_END} if a.get("status") == STARTED else a for a in attempts]
