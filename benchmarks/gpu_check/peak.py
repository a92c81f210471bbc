"""The device's measured matmul peak per dtype: the yardstick for every row's share of peak."""

from __future__ import annotations

import time

import torch

from gpuflow.scaling.distributed import synchronize

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def matmul_tflops(device: torch.device, dtype: torch.dtype, size: int, repeats: int) -> float:
    """TFLOP/s of the best of `repeats` square `size` matmuls (after one warm-up)."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    torch.mm(a, b)
    synchronize(device)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e12


def measured_peaks(device: torch.device, size: int, repeats: int = 5) -> dict[str, float]:
    """Matmul TFLOP/s of `device` per dtype name (fp32 without TF32; half types on GPUs only)."""
    names = ["float32"] + (["float16", "bfloat16"] if device.type == "cuda" else [])
    return {name: matmul_tflops(device, DTYPES[name], size, repeats) for name in names}
