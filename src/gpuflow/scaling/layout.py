"""How one scaling run is laid out: its batch split and each process's CPU threads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuflow.errors import ConfigError
from gpuflow.job import threads_per_worker


@dataclass(frozen=True)
class BatchPlan:
    """Samples per optimizer step overall, per process and micro-step, and micro-steps per step."""

    global_batch_size: int
    per_gpu_batch_size: int
    accumulation_steps: int


def batch_plan(train: dict[str, Any], world_size: int, key: str = "train") -> BatchPlan:
    """The batch sizes of one run; the global size fixed (strong scaling) or the per-GPU one."""
    accumulation = train["accumulation_steps"]
    global_size, per_gpu = train["global_batch_size"], train["per_gpu_batch_size"]
    if (global_size is None) == (per_gpu is None):
        raise ConfigError(
            f"{key}.global_batch_size", "set exactly one of global_batch_size, per_gpu_batch_size"
        )
    if per_gpu is not None:
        return BatchPlan(per_gpu * world_size * accumulation, per_gpu, accumulation)
    if global_size % (world_size * accumulation):
        raise ConfigError(
            f"{key}.global_batch_size",
            f"{global_size} does not split over world size {world_size} x "
            f"{accumulation} accumulation steps",
            "a multiple of world size x accumulation_steps",
        )
    return BatchPlan(global_size, global_size // (world_size * accumulation), accumulation)


def process_threads(on_gpu: bool, local_world: int, cpu_threads: int | None, cpu_slots: int) -> int:
    """Torch threads of each process: the node's cores over its GPU processes, or CPU slots."""
    if on_gpu:
        return threads_per_worker(local_world)
    return cpu_threads or threads_per_worker(cpu_slots)
