"""Telemetry row: the job sampler (NVML and the process tree) while the first device computes.

On a GPU the device CUDA calls 0 must be found by NVML (same UUID), busy (mean SM utilisation
above BUSY_PERCENT), with its memory and power read; without one the GPU part must name why
it is absent and the CPU part must have counted the computation.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from benchmarks.gpu_check.rows import CheckRow
from gpuflow.job.devices import describe_device
from gpuflow.job.telemetry.sampler import Sampler
from gpuflow.scaling.distributed import synchronize

INTERVAL_S = 0.2
BUSY_S = {"cuda": 3.0, "cpu": 1.0}
BUSY_PERCENT = 50


def _busy(device: torch.device, size: int) -> int:
    """Matrix products on `device` for BUSY_S seconds; returns how many ran."""
    a = torch.randn(size, size, device=device)
    count, end = 0, time.perf_counter() + BUSY_S[device.type]
    while time.perf_counter() < end:
        for _ in range(10):
            a = torch.tanh(a @ a)
        synchronize(device)
        count += 10
    return count


def _gpu_problems(gpu: dict[str, Any], device: torch.device) -> list[str]:
    if gpu.get("absent"):
        return [f"GPU telemetry absent: {gpu['absent']}"]
    cuda_uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    uuid = None if cuda_uuid is None else f"GPU-{cuda_uuid}"
    match = [d for d in gpu["devices"] if uuid is None or d["uuid"] == uuid]
    if not match:
        return [f"NVML saw no device with CUDA's UUID {uuid}: {gpu['devices']}"]
    first = match[0]
    problems = []
    if (first["sm_util_mean"] or 0) < BUSY_PERCENT:
        problems.append(f"mean SM utilisation {first['sm_util_mean']} < {BUSY_PERCENT}%")
    if not first["memory_used_peak_mb"]:
        problems.append("no memory use read")
    if first["power_mean_w"] is None and "power" not in first["unsupported"]:
        problems.append("no power read")
    return problems


def telemetry_row(devices: list[torch.device]) -> CheckRow:
    """The sampler on this process while devices[0] computes for a few seconds."""
    device = devices[0]
    sampler = Sampler(os.getpid(), INTERVAL_S, os.environ.get("CUDA_VISIBLE_DEVICES")).start()
    products = _busy(device, 4096 if device.type == "cuda" else 128)
    sampler.stop()
    summary = sampler.summary()
    gpu, cpu = summary["gpu"], summary["cpu"]
    if device.type == "cuda":
        problems = _gpu_problems(gpu, device)
        read = ", ".join(
            f"{d['device']}: SM {d['sm_util_mean']}%, mem peak {d['memory_used_peak_mb']} MB, "
            f"power {d['power_mean_w']} W, energy {d['energy_j']} J"
            for d in gpu.get("devices", [])
        )
    else:
        problems = [] if gpu.get("absent") else ["NVML answered without a GPU in use"]
        read = f"GPU absent: {gpu.get('absent')}"
    if cpu["cpu_seconds"] <= 0 or cpu["peak_rss_mb"] <= 0:
        problems.append(f"CPU part empty: {cpu}")
    return CheckRow(
        path=f"telemetry sampler (NVML + process tree) on {describe_device(device)}",
        ok=not problems,
        tolerance=f"GPU: the CUDA device found by UUID, SM util >= {BUSY_PERCENT}% while busy, "
        "memory and power read; CPU only: NVML's reason for no GPU; CPU time counted",
        deviation="; ".join(problems) or f"{read}; CPU {cpu['cores_busy_mean']:.2f} cores busy",
        throughput=summary["samples"] / summary["wall_s"],
        unit="samples/s",
        seconds=summary["wall_s"],
        devices=[describe_device(device)],
        extra={"telemetry": summary, "products": products},
    )
