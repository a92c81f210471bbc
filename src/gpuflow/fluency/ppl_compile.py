"""The scoring model through torch.compile, compiled before its first batch (config
fluency.perplexity.compile).

Inductor compiles the model for dynamic shapes (one compile serves every batch shape) and fuses
its elementwise work (bias, GELU, layer norm, residual adds) into few kernels: memory-bound work
on a GPU. Compiling runs on small dummy batches here, so it is neither timed as scoring nor first
met in the middle of a job, and a node that cannot compile (no C++ compiler on a CPU node) fails
at once, naming the key. The weights stay inputs of the compiled graph (not frozen constants), so
a compiled graph reused for another model in the same process computes with that model's weights.
"""

from __future__ import annotations

import time

import torch

from gpuflow.errors import ConfigError
from gpuflow.fluency.ppl_scoring import Forward, model_forward

# Dummy batch sizes no model dimension is likely to equal: dynamic shapes take sizes that are
# equal in the example for one symbol (duck sizing), and a later batch would compile again.
WARMUP_ROWS, WARMUP_LENGTH = 3, 7


def compiled_forward(model: torch.nn.Module, device: torch.device) -> tuple[Forward, float]:
    """`model`'s scoring forward (see model_forward) through torch.compile, already compiled
    on `device`, and the seconds compiling took.

    Dynamic shapes still specialise sizes 0 and 1, so two dummy batches compile every graph a
    job meets: several rows with every position scored, and one row with one position scored
    (a batch of one long window; a head that sees one position).
    """
    started = time.perf_counter()
    forward = model_forward(torch.compile(model, dynamic=True))
    try:
        with torch.inference_mode():  # as scoring runs: the guards check for inference tensors
            ids = torch.zeros((WARMUP_ROWS, WARMUP_LENGTH), dtype=torch.long, device=device)
            forward(ids, torch.ones_like(ids, dtype=torch.bool))
            one_scored = torch.zeros((1, WARMUP_LENGTH), dtype=torch.bool, device=device)
            one_scored[0, 0] = True
            forward(ids[:1].clone(), one_scored)
    except Exception as error:  # Inductor's errors have no common base class
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ConfigError(
            "fluency.perplexity.compile",
            f"torch.compile could not compile the scoring model on {device}: {reason}",
            "false, or a C++ compiler on CPU nodes (Triton on GPUs)",
        ) from error
    return forward, time.perf_counter() - started
