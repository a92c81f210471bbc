"""Process group set-up, barriers, small all-reduces and the gradient compression hook."""

import json
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from gpuflow.errors import ConfigError
from gpuflow.job import worker_devices
from gpuflow.scaling.rendezvous import ENDPOINT_ENV

COMPRESSION_HOOKS: dict[str, Callable[..., Any]] = {
    "fp16": default_hooks.fp16_compress_hook,
    "bf16": default_hooks.bf16_compress_hook,
}


@dataclass(frozen=True)
class Context:
    """Where this process sits: its rank, the world, its device and the backend."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    device: torch.device
    backend: str

    @property
    def nodes(self) -> int:
        """Nodes taking part (processes are spread evenly over them)."""
        return max(1, self.world_size // self.local_world_size)


NCCL_NAME = re.compile(r"^NCCL_[A-Z0-9_]+$")


def attempt_store() -> dist.Store:
    """The env:// store, its keys prefixed by torchrun's run id and restart count."""
    store, _, _ = next(dist.rendezvous("env://"))
    run = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"{run}/attempt_{restart}", store)


def use_nccl(text: str) -> dict[str, str]:
    """Set the site's NCCL settings not already in the environment; every NCCL_* in force."""
    try:
        settings = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError("--nccl", f"not valid JSON ({error})", "a JSON object") from None
    if not isinstance(settings, dict):
        raise ConfigError("--nccl", f"got {type(settings).__name__}", "a JSON object")
    kept = []
    for name, value in settings.items():
        if not NCCL_NAME.match(name) or not isinstance(value, str):
            raise ConfigError(f"--nccl {name}", f"{value!r}", "NCCL_* names with text values")
        if os.environ.setdefault(name, value) != value:
            kept.append(f"{name}={os.environ[name]} (the site says {value})")
    if kept and os.environ.get("RANK", "0") == "0":
        print(f"NCCL settings from the environment: {', '.join(kept)}", file=sys.stderr)
    return nccl_in_force()


def nccl_in_force() -> dict[str, str]:
    """Every NCCL_* variable of this process's environment."""
    return {name: value for name, value in sorted(os.environ.items()) if NCCL_NAME.match(name)}


def rendezvous() -> dict[str, str | None] | None:
    """Where torchrun's processes met: the c10d endpoint and the workers' store."""
    if "RANK" not in os.environ:
        return None
    workers = f"{os.environ.get('MASTER_ADDR', '')}:{os.environ.get('MASTER_PORT', '')}"
    return {"endpoint": os.environ.get(ENDPOINT_ENV), "workers": workers}


def init(device_choice: str) -> Context:
    """Join the process group torchrun set up (or make a one-process group) on the right device."""
    if "RANK" in os.environ:
        store = attempt_store()
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ["LOCAL_RANK"])
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    else:
        store, rank, world, local_rank, local_world = dist.HashStore(), 0, 1, 0, 1
    devices = worker_devices(device_choice, cpu_workers=local_world)
    if devices[0].type == "cuda" and len(devices) < local_world:
        raise ConfigError(
            "scaling.world_sizes",
            f"{local_world} processes on this node but only {len(devices)} GPUs visible",
            "one GPU per process",
        )
    device = devices[local_rank] if devices[0].type == "cuda" else torch.device("cpu")
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend,
        store=store,
        rank=rank,
        world_size=world,
        device_id=device if device.type == "cuda" else None,
    )
    return Context(rank, local_rank, world, local_world, device, backend)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on CPU, where work is synchronous)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def barrier(ctx: Context) -> None:
    """All processes reach this point, with their device work finished."""
    synchronize(ctx.device)
    if ctx.backend == "nccl":
        dist.barrier(device_ids=[ctx.device.index])
    else:
        dist.barrier()


def all_reduce(values: list[float], ctx: Context, op: str = "sum") -> list[float]:
    """Element-wise sum or max of `values` over all processes."""
    tensor = torch.tensor(values, dtype=torch.float64, device=ctx.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return tensor.tolist()


class Ranks:
    """The run's processes as gpuflow.job's resumable loop needs them."""

    def __init__(self, ctx: Context):
        self.ctx = ctx

    def barrier(self) -> None:
        """Every rank reaches this point."""
        barrier(self.ctx)

    def any(self, flag: bool) -> bool:
        """Whether `flag` holds on any rank."""
        return all_reduce([float(flag)], self.ctx, op="max")[0] > 0
