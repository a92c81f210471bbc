"""A rule's CPUs in SLURM's words: `cpus_per_gpu` on a GPU rule, `cpus_per_task` on a CPU one."""

from __future__ import annotations

from typing import Any

from gpuflow.errors import ConfigError

PER_GPU = "cpus_per_gpu"
PER_TASK = "cpus_per_task"
WHAT = {PER_GPU: "--cpus-per-gpu", PER_TASK: "--cpus-per-task"}


def cpus_key(block: dict[str, Any]) -> str:
    """The key that holds a rule's cores: cpus_per_gpu on a GPU rule, cpus_per_task on others."""
    return PER_GPU if int(block.get("gpu") or 0) > 0 else PER_TASK


def cpus_of(block: dict[str, Any], key: str) -> int:
    """A rule's cores (per GPU on a GPU rule, per task on a CPU rule; 1 where none are set)."""
    wanted = cpus_key(block)
    other = PER_TASK if wanted == PER_GPU else PER_GPU
    if other in block and wanted not in block:
        kind = f"a GPU rule (gpu: {block['gpu']}) counts its cores per GPU"
        if wanted == PER_TASK:
            kind = f"a CPU rule (gpu: {block.get('gpu', 0)}) counts its cores per task"
        raise ConfigError(
            f"{key}.{other}",
            f"{kind}, as SLURM's {WHAT[wanted]}",
            f"{wanted}: {block[other]} in its place",
        )
    return int(block.get(wanted, 1))


def check_resources(config: dict[str, Any]) -> None:
    """Check every `<family>.resources.<rule>` block and fill its own kind's key."""
    for family, section in config.items():
        blocks = section.get("resources") if isinstance(section, dict) else None
        for rule, block in (blocks or {}).items() if isinstance(blocks, dict) else ():
            if not isinstance(block, dict):
                continue
            cpus = cpus_of(block, f"{family}.resources.{rule}")
            block.pop(PER_GPU, None)
            block.pop(PER_TASK, None)
            block[cpus_key(block)] = cpus
