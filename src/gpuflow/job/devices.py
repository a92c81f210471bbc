"""Which devices a job uses, and the record of where it ran."""

from __future__ import annotations

import os
import socket
from typing import Any

import torch

from gpuflow.errors import ConfigError
from gpuflow.job.telemetry.job import current as telemetry_so_far

DEVICE_CHOICES = ("auto", "cuda", "cpu")


def worker_devices(device: str = "auto", cpu_workers: int = 1) -> list[torch.device]:
    """The devices to start one worker on each: all visible GPUs, or `cpu_workers` CPU slots."""
    if device not in DEVICE_CHOICES:
        raise ConfigError("device", f"unknown device {device!r}", f"one of {DEVICE_CHOICES}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", "'cuda' was asked for but no CUDA device is visible")
    if device in ("auto", "cuda") and torch.cuda.is_available():
        return [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    if cpu_workers < 1:
        raise ConfigError("cpu_workers", f"must be at least 1, got {cpu_workers}")
    return [torch.device("cpu")] * cpu_workers


def run_record(devices: list[torch.device] | None = None) -> dict[str, Any]:
    """Where this job ran: host, SLURM job, GPUs and devices used, and its telemetry so far."""
    return {
        "host": socket.gethostname(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "devices": [describe_device(d) for d in devices or []],
        "telemetry": telemetry_so_far(),
    }


def describe_device(device: torch.device) -> str:
    """A readable name for a device, e.g. 'cuda:0 (NVIDIA A100-SXM4-40GB)' or 'cpu'."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    return device.type
