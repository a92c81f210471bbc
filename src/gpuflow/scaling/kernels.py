"""A scaling run's kernel choices: fused AdamW, TF32 matmuls, padded lengths for cuDNN attention."""

from __future__ import annotations

from typing import Any

import torch


def use_fused_adamw(choice: str, device: torch.device) -> bool:
    """Whether AdamW runs as one fused kernel (`auto`: on CUDA; `always`; `never`)."""
    return choice == "always" or (choice == "auto" and device.type == "cuda")


def adamw(params: Any, fused: bool, **hyper: float) -> torch.optim.AdamW:
    """AdamW with torch's fused kernel, or torch's default implementation for the device."""
    return torch.optim.AdamW(params, **hyper, **({"fused": True} if fused else {}))


# Half-precision attention on a Hopper GPU runs in cuDNN (torch 2.11 prefers it there), which
# builds a graph for every new sequence length, hundreds of milliseconds each: batches padded to
# their own longest text made bf16 AMP run at half the fp32 rate (gpu-check on an H100,
# 2026-11-26: 300,845 against 606,913 tokens/s; at one fixed length bf16 was 3.1x fp32).
CUDA_HALF_LENGTH_MULTIPLE = 64


def padded_length_multiple(device: torch.device, precision: str) -> int:
    """What a batch's padded length is rounded up to: 64 for bf16/fp16 on CUDA, else 1."""
    half = precision in ("bf16", "fp16")
    return CUDA_HALF_LENGTH_MULTIPLE if device.type == "cuda" and half else 1


def set_tf32(enabled: bool, device: torch.device) -> bool:
    """Let CUDA fp32 matmuls run in TF32 when `enabled` on a GPU; returns whether they do."""
    if not (enabled and device.type == "cuda"):
        return False
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    return True
