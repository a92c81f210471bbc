"""The token budget of a GPU job, sized from the free memory of its GPUs when asked to."""

from __future__ import annotations

from typing import Any

import torch

from gpuflow.fluency.placement import batch_bytes, model_bytes


def budget_for_memory(
    free_bytes: int, model_bytes: int, bytes_per_token: int, share: float, floor: int
) -> int:
    """Padded tokens one batch may hold so that the model plus the batch fill `share` of
    `free_bytes`; never below `floor` (the configured budget)."""
    room = share * free_bytes - model_bytes
    return max(floor, int(room // bytes_per_token))


def sized_token_budget(
    token_budget: int,
    share: float,
    config: Any,
    devices: list[torch.device],
    dtype: str,
    placement: str,
) -> tuple[int, str]:
    """(budget, why): `token_budget`, or on GPUs with `share` > 0 the budget that fills that
    share of the smallest GPU's free memory (a sharded model's weights split over the GPUs).
    `share` is config fluency.perplexity.fill_free_memory, checked by its schema: [0, 1)."""
    if share == 0:
        return token_budget, "as configured"
    if devices[0].type != "cuda":
        return token_budget, "as configured (CPU workers: sized for cache, not memory)"
    free = min(torch.cuda.mem_get_info(d)[0] for d in devices)
    weights = model_bytes(config, dtype) // (len(devices) if placement == "shard" else 1)
    budget = budget_for_memory(free, weights, batch_bytes(config, 1, dtype), share, token_budget)
    return budget, f"{share:.0%} of {free / 2**30:.1f} GiB free per GPU"
