"""Communication measured apart from the timed epochs: total and exposed all-reduce per step."""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from gpuflow.scaling import distributed
from gpuflow.scaling.distributed import Context

WIRE_DTYPES = {"none": None, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class CommMeasurement:
    """Milliseconds per optimizer step (one all-reduce each), medians over the probe window."""

    sync_step_ms: float | None
    no_sync_step_ms: float | None
    exposed_ms: float
    total_ms: float
    probe_steps: int


NO_PROBE = CommMeasurement(None, None, 0.0, 0.0, 0)  # one process, or no batch: nothing to time


def gradient_buckets(model: torch.nn.Module, bucket_cap_mb: float) -> Iterator[list[torch.Tensor]]:
    """The gradients in DDP's order (parameters reversed), grouped up to `bucket_cap_mb` each."""
    cap = bucket_cap_mb * 2**20
    bucket: list[torch.Tensor] = []
    size = 0
    for param in reversed([p for p in model.parameters() if p.grad is not None]):
        bucket.append(param.grad)
        size += param.grad.numel() * param.grad.element_size()
        if size >= cap:
            yield bucket
            bucket, size = [], 0
    if bucket:
        yield bucket


def allreduce_seconds(
    model: torch.nn.Module, bucket_cap_mb: float, compression: str, ctx: Context
) -> float:
    """Wall time to all-reduce this step's gradients bucket by bucket, each waited for."""
    wire = WIRE_DTYPES[compression]
    flats = [torch.cat([g.reshape(-1) for g in b]) for b in gradient_buckets(model, bucket_cap_mb)]
    flats = [flat.to(wire) if wire is not None else flat for flat in flats]
    distributed.barrier(ctx)
    start = time.perf_counter()
    for flat in flats:
        dist.all_reduce(flat)
    distributed.synchronize(ctx.device)
    return time.perf_counter() - start


def timed_step(step: Callable[[], None], ctx: Context) -> float:
    """One forward/backward started on all ranks at once, finished on this rank's device."""
    distributed.barrier(ctx)
    start = time.perf_counter()
    step()
    distributed.synchronize(ctx.device)
    return time.perf_counter() - start


def measure(
    ddp: DistributedDataParallel,
    batches: list[Any],
    step: Callable[[Any], None],
    ctx: Context,
    ddp_settings: dict[str, Any],
) -> CommMeasurement:
    """Replay `batches` with and without gradient sync; time the bare all-reduce of each step."""
    sync, no_sync, total = [], [], []
    devices = [ctx.device] if ctx.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        for index, batch in enumerate(batches):
            # Alternate which comes first, so a slow start does not always hit the same mode.
            for mode in ("sync", "no_sync") if index % 2 == 0 else ("no_sync", "sync"):
                if mode == "sync":
                    sync.append(timed_step(functools.partial(step, batch), ctx))
                    cap, compression = ddp_settings["bucket_cap_mb"], ddp_settings["compression"]
                    total.append(allreduce_seconds(ddp.module, cap, compression, ctx))
                else:
                    with ddp.no_sync():
                        no_sync.append(timed_step(functools.partial(step, batch), ctx))
                ddp.module.zero_grad(set_to_none=True)
    slowest = torch.tensor([sync, no_sync, total], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    sync_s, no_sync_s, total_s = (statistics.median(row) for row in slowest.tolist())
    return CommMeasurement(
        sync_step_ms=1000 * sync_s,
        no_sync_step_ms=1000 * no_sync_s,
        exposed_ms=1000 * max(0.0, sync_s - no_sync_s),
        total_ms=1000 * total_s,
        probe_steps=len(batches),
    )
