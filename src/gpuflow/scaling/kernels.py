"""Kernel choices of a scaling run: fused AdamW and TF32 matmuls.

Fused AdamW changes what a step computes only by float rounding: a runtime setting (a change
re-runs nothing, and a resume state saved under one choice resumes under the other). TF32 lowers
the precision of fp32 matmuls, as amp does: a results setting.
"""

from __future__ import annotations

from typing import Any

import torch


def use_fused_adamw(choice: str, device: torch.device) -> bool:
    """Whether AdamW runs as one fused kernel: `auto` fuses on CUDA (one launch for all the
    parameters instead of several per tensor), `always` also on CPU, `never` nowhere."""
    return choice == "always" or (choice == "auto" and device.type == "cuda")


def adamw(params: Any, fused: bool, **hyper: float) -> torch.optim.AdamW:
    """AdamW with torch's fused kernel, or torch's default implementation for the device."""
    return torch.optim.AdamW(params, **hyper, **({"fused": True} if fused else {}))


def set_tf32(enabled: bool, device: torch.device) -> bool:
    """Let CUDA matmuls of fp32 tensors run in TF32 when `enabled` and training on a GPU; returns
    whether they do. TF32 has no CPU counterpart here: CPU matmuls stay IEEE fp32."""
    if not (enabled and device.type == "cuda"):
        return False
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    return True
