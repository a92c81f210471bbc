"""Score segments in token-budget batches: right padding, fp32 loss, float64 sums, OOM retry.

The model is reached only through a `Forward` callable `(input_ids, attention_mask) -> logits`,
so the very same code runs on a GPU, on a CPU, and in tests that inject out-of-memory errors.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from gpuflow.errors import GpuflowError
from gpuflow.fluency.ppl_segments import Segment, batch_size_for

Forward = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
LOSS_CHUNK_TOKENS = 512
IGNORE = -100


def model_forward(model: torch.nn.Module) -> Forward:
    """The forward call of a Hugging Face causal LM: logits for right-padded input."""

    def forward(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits

    return forward


@dataclass
class SegmentScores:
    """Per-segment NLL sums (float64) and scored-token counts, in the order given.

    `seconds` is the scoring time alone (model loading excluded).
    """

    nll: np.ndarray
    n_tokens: np.ndarray
    token_budget: int
    oom_splits: int
    seconds: float = 0.0


def pad_right(
    segments: Sequence[Segment], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids and attention mask padded on the right to the batch's longest row, and `first`s."""
    longest = max(len(s.ids) for s in segments)
    ids = torch.zeros((len(segments), longest), dtype=torch.long)
    mask = torch.zeros((len(segments), longest), dtype=torch.long)
    for row, segment in enumerate(segments):
        ids[row, : len(segment.ids)] = torch.tensor(segment.ids, dtype=torch.long)
        mask[row, : len(segment.ids)] = 1
    first = torch.tensor([s.first for s in segments], dtype=torch.long)
    return ids.to(device), mask.to(device), first.to(device)


def batch_nll(
    logits: torch.Tensor,
    ids: torch.Tensor,
    mask: torch.Tensor,
    first: torch.Tensor,
    chunk_tokens: int = LOSS_CHUNK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """NLL sum (float64) and target count of each row; logits are upcast to fp32 first.

    Target position j (predicted by logits at j-1) counts when both j and j-1 are real tokens
    and j >= the row's first scored position. Padding is found from the mask, never from ids.
    The cross-entropy runs over `chunk_tokens` positions at a time, so each fp32 chunk stays
    small: in cache on a CPU, little extra memory on a GPU.
    """
    batch, length, vocab = logits.shape
    positions = torch.arange(1, length, device=ids.device)
    scored = (mask[:, 1:] * mask[:, :-1]).bool() & (positions[None, :] >= first[:, None])
    targets = torch.full_like(ids, IGNORE)
    targets[:, :-1] = torch.where(scored, ids[:, 1:], IGNORE)
    flat_logits, flat_targets = logits.reshape(batch * length, vocab), targets.view(-1)
    losses = torch.cat(
        [
            F.cross_entropy(
                flat_logits[start : start + chunk_tokens].float(),
                flat_targets[start : start + chunk_tokens],
                reduction="none",
                ignore_index=IGNORE,
            )
            for start in range(0, batch * length, chunk_tokens)
        ]
    )
    return losses.view(batch, length).double().sum(dim=1), scored.sum(dim=1)


def _try_batch(
    segments: Sequence[Segment], forward: Forward, device: torch.device
) -> list[tuple[float, int]] | None:
    """(nll, count) of each segment of one batch, or None when the device ran out of memory."""
    try:
        ids, mask, first = pad_right(segments, device)
        nll, counts = batch_nll(forward(ids, mask), ids, mask, first)
        return list(zip(nll.tolist(), counts.tolist(), strict=True))
    except torch.OutOfMemoryError:
        pass
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return None


def score_segments(
    segments: Sequence[Segment],
    forward: Forward,
    device: torch.device,
    token_budget: int,
    progress: tqdm | None = None,
) -> SegmentScores:
    """Score segments (sorted longest first for little padding) in token-budget batches.

    A batch holds as many segments as fit `batch size x longest <= token_budget` (at least one)
    and is padded only to its own longest. On out-of-memory the budget drops to half the
    failed batch and the same segments are batched again, so the batch is split in halves
    and later batches keep the lower budget; nothing is ever dropped.
    """
    results: list[tuple[float, int]] = []
    oom_splits, start = 0, 0
    started = time.perf_counter()
    with torch.inference_mode():
        while start < len(segments):
            longest = len(segments[start].ids)
            batch = segments[start : start + batch_size_for(longest, token_budget)]
            scores = _try_batch(batch, forward, device)
            if scores is None:
                if len(batch) == 1:
                    raise GpuflowError(
                        f"out of memory on {device} scoring a single window of {longest} "
                        "tokens: use a GPU with more memory, half precision (dtype), or a "
                        "smaller model"
                    )
                token_budget = min(token_budget, longest * (len(batch) // 2))
                oom_splits += 1
                if progress is not None:
                    progress.write(
                        f"out of memory on a batch of {len(batch)} x {longest} tokens: "
                        f"split in halves, token budget now {token_budget}"
                    )
                continue
            results.extend(scores)
            start += len(batch)
            if progress is not None:
                progress.update(sum(count for _, count in scores))
    return SegmentScores(
        nll=np.array([nll for nll, _ in results], dtype=np.float64),
        n_tokens=np.array([count for _, count in results], dtype=np.int64),
        token_budget=token_budget,
        oom_splits=oom_splits,
        seconds=time.perf_counter() - started,
    )
