"""Perplexity rows: fp32/fp16/bf16 through the workflow's scorer, and a forced out-of-memory split.

The model is a randomly initialised GPT-2 (GPT-2-large's shape on a GPU) saved to a folder and
loaded by the scorer exactly as a user's model; texts are seeded random token ids.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.gpu_check.rows import CheckRow, max_relative_difference
from benchmarks.gpu_check.sizes import CheckSizes
from gpuflow.fluency.perplexity import score_token_ids, scoring_settings
from gpuflow.fluency.ppl_model import load_causal_lm
from gpuflow.fluency.ppl_scoring import Forward
from gpuflow.fluency.work import lm_shape
from gpuflow.job.devices import describe_device

BOS = 0
TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 3e-2}
SHARD_TOLERANCE = {"float32": 1e-6, "float16": 5e-3, "bfloat16": 2e-2}
OOM_TOLERANCE = 5e-3
PRECISION_RUNS = (  # dtype, placement, torch.compile
    ("float32", "replicate", False),
    ("float16", "replicate", False),
    ("bfloat16", "replicate", False),
    ("float16", "shard", False),
    ("float16", "replicate", True),
)


def save_random_lm(folder: Path, lm: dict[str, int], device: torch.device) -> int:
    """Save a randomly initialised GPT-2 of shape `lm` to `folder`; return its parameter count."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(**lm, bos_token_id=BOS, eos_token_id=BOS)
    with torch.device(device):
        model = GPT2LMHeadModel(config)
    model.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def random_texts(
    n: int, min_tokens: int, max_tokens: int, vocab: int, seed: int
) -> list[list[int]]:
    """`n` texts of seeded random token ids (never the BOS id), lengths uniform in the range."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_tokens, max_tokens + 1, size=n)
    return [rng.integers(1, vocab, size=int(length)).tolist() for length in lengths]


def reference_perplexities(
    folder: Path, texts: list[list[int]], device: torch.device
) -> list[float]:
    """The definition, one text at a time in fp32: exp(mean CE(logits[:-1], ids[1:]))."""
    model = load_causal_lm(str(folder), "float32", device)
    values = []
    with torch.inference_mode():
        for tokens in texts:
            ids = torch.tensor([[BOS, *tokens]], device=device)
            logits = model(input_ids=ids).logits.float()
            values.append(math.exp(F.cross_entropy(logits[0, :-1], ids[0, 1:]).item()))
    del model
    return values


def row_dtype(dtype: str, devices: list[torch.device]) -> str:
    """The dtype a row runs in: as named on GPUs, its fp32 twin on the CPU."""
    return dtype if devices[0].type == "cuda" else "float32"


def score(
    folder: Path,
    texts: list[list[int]],
    devices: list[torch.device],
    dtype: str,
    token_budget: int,
    context: int,
    wrap_forward: Callable[[Forward], Forward] | None = None,
    placement: str = "replicate",
    compile: bool = False,
) -> tuple[np.ndarray, dict]:
    """Per-text perplexities and the scorer's stats, through the workflow's scorer."""
    nll, n_tokens, stats = score_token_ids(
        texts,
        model=str(folder),
        bos_id=BOS,
        context=context,
        stride=context // 2,
        devices=devices,
        settings=scoring_settings(
            dtype=dtype, token_budget=token_budget, placement=placement, compile=compile
        ),
        wrap_forward=wrap_forward,
    )
    return np.exp(nll / n_tokens), {**stats, "tokens": int(n_tokens.sum())}


def precision_rows(
    folder: Path,
    n_params: int,
    sizes: CheckSizes,
    devices: list[torch.device],
    peaks: dict[str, float],
    compile: bool = True,
) -> list[CheckRow]:
    """fp32 (against the one-text-at-a-time reference), fp16 and bf16 (against fp32), then
    fp16 with the model sharded over the devices and, with `compile`, fp16 through
    torch.compile (config fluency.perplexity.compile; its compiling is done before the first
    batch, so not timed), both against fp16 replicated.

    Each is timed after `warmup_passes` untimed passes over the same texts (a GPU picks its
    kernels per batch shape on first sight). On the CPU the half-precision rows are fp32 twins
    of the fp32 row and run in one worker.
    """
    context = sizes.lm["n_positions"]
    texts = random_texts(
        sizes.ppl_texts, sizes.ppl_min_tokens, context - 1, sizes.lm["vocab_size"], 0
    )
    reference = reference_perplexities(folder, texts[: sizes.ppl_reference_texts], devices[0])
    rows: list[CheckRow] = []
    results: dict[str, np.ndarray] = {}
    for dtype, placement, compiled in PRECISION_RUNS:
        if compiled and not compile:
            continue
        ran_as = row_dtype(dtype, devices)
        run_on = devices if ran_as == dtype or placement == "shard" else devices[:1]
        for _ in range(sizes.warmup_passes + 1):
            ppl, stats = score(
                folder, texts, run_on, ran_as, sizes.ppl_token_budget, context, None, placement,
                compiled,
            )  # fmt: skip
        if placement == "replicate" and not compiled:
            results[dtype] = ppl  # what the half-precision, sharded and compiled runs are held to
        path = f"perplexity {dtype} x{len(run_on)} worker(s)"
        tolerance = TOLERANCE[ran_as]
        if compiled:
            deviation = max_relative_difference(ppl, results[dtype])
            against = f"the {dtype} run without torch.compile ({len(texts)} texts)"
            path += " + torch.compile"
        elif placement == "shard":
            deviation = max_relative_difference(ppl, results[dtype])
            against = f"the replicated {dtype} run ({len(texts)} texts)"
            tolerance = SHARD_TOLERANCE[ran_as]
            path = f"perplexity {dtype} one model sharded over {len(devices)} device(s)"
        elif dtype == "float32":
            deviation = max_relative_difference(ppl[: len(reference)], reference)
            against = f"one-text-at-a-time fp32 reference ({len(reference)} texts)"
        else:
            deviation = max_relative_difference(ppl, results["float32"])
            against = f"the batched fp32 run ({len(texts)} texts)"
        path += "" if ran_as == dtype else f" (CPU twin: {ran_as})"
        row = throughput_row(
            path, deviation, tolerance, against, stats, n_params, peaks[ran_as], run_on
        )
        row.extra["first_perplexities"] = ppl[: len(reference)].tolist()
        if placement == "replicate" and not compiled and ran_as == dtype:
            lm = sizes.lm
            shape = lm_shape(lm["n_layer"], lm["n_embd"], lm["vocab_size"], context, dtype)
            row.rated("lm.forward.flop", shape)
        rows.append(row)
    return rows


def throughput_row(
    path: str,
    deviation: float,
    tolerance: float,
    against: str,
    stats: dict,
    n_params: int,
    peak: float,
    devices: list[torch.device],
) -> CheckRow:
    """A scoring row: tokens/s over the scoring time, FLOPs counted as 2 x parameters per token."""
    seconds = max(stats["scoring_seconds"], 1e-9)
    tokens_per_s = stats["tokens"] / seconds
    return CheckRow(
        path=path,
        ok=bool(deviation <= tolerance),
        tolerance=f"max relative ppl difference <= {tolerance:g} vs {against}",
        deviation=f"{deviation:.2e}",
        throughput=tokens_per_s,
        unit="tokens/s",
        tflops=2 * n_params * tokens_per_s / 1e12 / len(devices),
        peak_tflops=peak,
        seconds=seconds,
        devices=sorted({describe_device(d) for d in devices}),
        extra={k: stats[k] for k in ("tokens", "segments", "oom_splits", "final_token_budget")},
    )


def oversized_batch(sizes: CheckSizes, device: torch.device, element: int) -> tuple[int, int]:
    """(texts, logits bytes) of one full-context batch whose logits (of `element` bytes) exceed
    the memory in play: on a GPU the device's whole memory, on the CPU twin a simulated device
    of 64 texts."""
    per_text = sizes.lm["n_positions"] * sizes.lm["vocab_size"] * element
    memory = (
        torch.cuda.get_device_properties(device).total_memory
        if device.type == "cuda"
        else 64 * per_text
    )
    n_texts = math.ceil(sizes.oom_memory_factor * memory / per_text)
    return n_texts, n_texts * per_text


def device_memory_of(allowance: int, vocab: int, element: int) -> Callable[[Forward], Forward]:
    """The CPU twin of a full device: a forward whose logits exceed `allowance` bytes raises
    torch.OutOfMemoryError, as CUDA's allocator does (a CPU process has no such limit)."""

    def wrap(forward: Forward) -> Forward:
        def limited(input_ids: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
            if input_ids.numel() * vocab * element > allowance:
                raise torch.OutOfMemoryError(
                    f"CPU twin: logits of {tuple(input_ids.shape)} exceed {allowance} bytes"
                )
            return forward(input_ids, scored)

        return limited

    return wrap


def oom_row(
    folder: Path,
    n_params: int,
    sizes: CheckSizes,
    devices: list[torch.device],
    peaks: dict[str, float],
) -> CheckRow:
    """A token budget holding every text in one batch: it must run out of memory and split."""
    device = devices[0]
    on_gpu = device.type == "cuda"
    dtype = row_dtype("float16", devices)
    context = sizes.lm["n_positions"]
    element = torch.finfo(getattr(torch, dtype)).bits // 8
    n_texts, batch_bytes = oversized_batch(sizes, device, element)
    texts = random_texts(n_texts, context - 1, context - 1, sizes.lm["vocab_size"], 1)
    allowance = int(batch_bytes / sizes.oom_memory_factor)
    wrap = None if on_gpu else device_memory_of(allowance, sizes.lm["vocab_size"], element)
    ppl, stats = score(folder, texts, [device], dtype, n_texts * context, context, wrap)
    reference, _ = score(folder, texts, [device], dtype, sizes.ppl_token_budget, context)
    deviation = max_relative_difference(ppl, reference)
    path = f"perplexity {dtype} out-of-memory split ({n_texts} x {context} tokens in one batch)"
    path += "" if on_gpu else " (CPU twin: simulated device memory)"
    against = f"the same texts at token budget {sizes.ppl_token_budget}, and >= 1 split"
    row = throughput_row(
        path, deviation, OOM_TOLERANCE, against, stats, n_params, peaks[dtype], [device]
    )
    row.ok = row.ok and stats["oom_splits"] >= 1
    row.extra["logits_gib_of_first_batch"] = round(batch_bytes / 2**30, 1)
    return row
