"""Where the reference LM lives: a copy per GPU (replicate) or one copy across the GPUs (shard)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from gpuflow.errors import ConfigError, GpuflowError

if TYPE_CHECKING:  # torch is imported where a placement is computed, not by `gpuflow plan`
    import torch

PLACEMENTS = ("auto", "replicate", "shard")
HEADROOM = 0.9  # share of a GPU's free memory the model and a batch may fill
ACTIVATIONS_PER_TOKEN = 16  # hidden-size vectors alive per token in a forward (estimate)


def model_bytes(config: Any, dtype: str) -> int:
    """Bytes of the model's parameters in `dtype` (meta device), with a padded head's copy."""
    import torch
    from transformers import AutoModelForCausalLM

    from gpuflow.fluency.ppl_model import DTYPES, padded_head_bytes

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    parameters = sum(p.numel() for p in model.parameters()) * DTYPES[dtype].itemsize
    return parameters + padded_head_bytes(model.get_output_embeddings(), DTYPES[dtype])


def batch_bytes(config: Any, token_budget: int, dtype: str) -> int:
    """Estimated peak bytes of one batch: logits plus the hidden states alive in a forward."""
    from gpuflow.fluency.ppl_model import DTYPES

    element = DTYPES[dtype].itemsize
    hidden = getattr(config, "hidden_size", None) or getattr(config, "n_embd", 0)
    return token_budget * (config.vocab_size * element + ACTIVATIONS_PER_TOKEN * hidden * element)


def choose_placement(
    requested: str, config: Any, devices: list[torch.device], dtype: str, token_budget: int
) -> tuple[str, str]:
    """(placement, why): `requested`, or for auto replicate when model + batch fit one GPU."""
    if requested not in PLACEMENTS:
        raise ConfigError(
            "fluency.perplexity.placement", f"unknown placement {requested!r}", str(PLACEMENTS)
        )
    if requested != "auto":
        return requested, "as configured"
    if devices[0].type != "cuda":
        return "replicate", "auto: CPU workers each hold a copy"
    import torch

    need = model_bytes(config, dtype) + batch_bytes(config, token_budget, dtype)
    free = min(torch.cuda.mem_get_info(d)[0] for d in devices)
    fits = need <= HEADROOM * free
    gib = f"{need / 2**30:.1f} GiB model + batch, {free / 2**30:.1f} GiB free per GPU"
    return "replicate" if fits else "shard", f"auto: {gib}"


def budget_for_memory(
    free_bytes: int, model_bytes: int, bytes_per_token: int, share: float, floor: int
) -> int:
    """Padded tokens per batch so that model plus batch fill `share` of `free_bytes`, >= `floor`."""
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
    """(budget, why): `token_budget`, or on GPUs the budget filling `share` of free memory."""
    if share == 0:
        return token_budget, "as configured"
    if devices[0].type != "cuda":
        return token_budget, "as configured (CPU workers: sized for cache, not memory)"
    import torch

    free = min(torch.cuda.mem_get_info(d)[0] for d in devices)
    weights = model_bytes(config, dtype) // (len(devices) if placement == "shard" else 1)
    budget = budget_for_memory(free, weights, batch_bytes(config, 1, dtype), share, token_budget)
    return budget, f"{share:.0%} of {free / 2**30:.1f} GiB free per GPU"


def load_sharded(
    reference: str, dtype: str, devices: list[torch.device], trust_remote_code: bool = False
) -> torch.nn.Module:
    """One copy of the causal LM spread over `devices` by an accelerate device map, in eval mode."""
    from gpuflow.fluency.ppl_model import load_causal_lm

    device_map = "balanced" if devices[0].type == "cuda" else {"": "cpu"}
    return load_causal_lm(reference, dtype, devices[0], trust_remote_code, device_map=device_map)


def config_file_here(model_path: str) -> bool:
    """Whether a model config is on this machine, looked up without torch or transformers."""
    if os.path.isdir(model_path):
        return os.path.isfile(os.path.join(model_path, "config.json"))
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(model_path, "config.json"), str)
    except ValueError:  # not a valid model id either
        return False


def fluency_placement(fluency: dict[str, Any]) -> str:
    """How each perplexity job of a validated fluency config will hold the reference LM."""
    perplexity, model_path = fluency["perplexity"], fluency["lm"]["path"]
    gpus = fluency["resources"]["fluency_perplexity"]["gpu"]
    requested = perplexity["placement"]
    if gpus == 0:
        return f"{requested}: CPU workers, each with a copy (replicate)"
    if model_path is None:
        return f"{requested}: the embedded LM is small, every GPU gets a copy (replicate)"
    unreadable = f"{requested}: model {model_path!r} is not readable here; decided on the GPU node"
    if not config_file_here(model_path):
        return unreadable
    import torch

    from gpuflow.fluency.ppl_model import load_config

    try:
        config = load_config(model_path)
    except GpuflowError:
        return unreadable
    need = model_bytes(config, perplexity["dtype"])
    need += batch_bytes(config, perplexity["token_budget"], perplexity["dtype"])
    size = f"model + one batch {need / 2**30:.1f} GiB"
    if requested != "auto":
        return f"{requested} ({size})"
    if torch.cuda.is_available():
        devices = [torch.device("cuda", i) for i in range(min(gpus, torch.cuda.device_count()))]
        chosen, reason = choose_placement(
            "auto", config, devices, perplexity["dtype"], perplexity["token_budget"]
        )
        return f"auto -> {chosen} on this machine ({reason})"
    return (
        f"auto: replicate on GPUs with {need / HEADROOM / 2**30:.1f} GiB free, else shard ({size})"
    )
