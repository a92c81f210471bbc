"""Score segments in token-budget batches: right padding, fp32 loss, float64 sums, OOM retry."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

from gpuflow.errors import GpuflowError
from gpuflow.fluency.ppl_segments import Segment, batch_size_for

Forward = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
LOSS_CHUNK_TOKENS = 512


def model_forward(model: torch.nn.Module) -> Forward:
    """The forward call of a causal LM on right-padded ids: the logits at the `scored` positions."""
    head = model.get_output_embeddings()

    def forward(input_ids: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
        everywhere = torch.ones_like(input_ids)
        if head is None:
            logits = model(input_ids=input_ids, attention_mask=everywhere, use_cache=False).logits
            return logits[scored.to(logits.device)]

        def only_scored(_module: torch.nn.Module, args: tuple) -> tuple:
            hidden, *rest = args
            return (hidden[scored.to(hidden.device)], *rest)

        handle = head.register_forward_pre_hook(only_scored)
        try:
            return model(input_ids=input_ids, attention_mask=everywhere, use_cache=False).logits
        finally:
            handle.remove()

    return forward


@dataclass
class SegmentScores:
    """Per-segment NLL sums (float64) and scored-token counts, in the order given."""

    nll: np.ndarray
    n_tokens: np.ndarray
    token_budget: int
    oom_splits: int
    seconds: float = 0.0
    load_seconds: float = 0.0


def pad_right(
    segments: Sequence[Segment], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids and attention mask padded on the right to the batch's longest row, and `first`s."""
    rows = [torch.tensor(s.ids, dtype=torch.long) for s in segments]
    ids = pad_sequence(rows, batch_first=True)
    mask = pad_sequence([torch.ones_like(row) for row in rows], batch_first=True)
    first = torch.tensor([s.first for s in segments], dtype=torch.long)
    return ids.to(device), mask.to(device), first.to(device)


def scored_positions(mask: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """Which logits positions are scored (batch x length, bool), from the mask."""
    following = torch.arange(1, mask.shape[1] + 1, device=mask.device)
    real_next = F.pad(mask[:, 1:], (0, 1))  # whether the next position holds a real id
    return (mask * real_next).bool() & (following[None, :] >= first[:, None])


def target_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """-log p(target) of each logits row in fp32, LOSS_CHUNK_TOKENS rows at a time."""
    return torch.cat(
        [
            F.cross_entropy(
                logits[start : start + LOSS_CHUNK_TOKENS].float(),
                targets[start : start + LOSS_CHUNK_TOKENS],
                reduction="none",
            )
            for start in range(0, len(targets), LOSS_CHUNK_TOKENS)
        ]
    )


def batch_nll(
    forward: Forward, ids: torch.Tensor, mask: torch.Tensor, first: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """NLL sum (float64) and target count of each row of a right-padded batch."""
    scored = scored_positions(mask, first)
    targets = ids[:, 1:][scored[:, :-1]]
    logits = forward(ids, scored)
    losses = torch.zeros(ids.shape, dtype=torch.float64, device=ids.device)
    losses[scored] = target_nll(logits, targets.to(logits.device)).to(losses.device, torch.float64)
    return losses.sum(dim=1), scored.sum(dim=1)


def _try_batch(
    segments: Sequence[Segment], forward: Forward, device: torch.device
) -> list[tuple[float, int]] | None:
    """(nll, count) of each segment of one batch, or None when the device ran out of memory."""
    try:
        ids, mask, first = pad_right(segments, device)
        nll, counts = batch_nll(forward, ids, mask, first)
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
) -> SegmentScores:
    """Score segments (sorted longest first for little padding) in token-budget batches."""
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
                continue
            results.extend(scores)
            start += len(batch)
    return SegmentScores(
        nll=np.array([nll for nll, _ in results], dtype=np.float64),
        n_tokens=np.array([count for _, count in results], dtype=np.int64),
        token_budget=token_budget,
        oom_splits=oom_splits,
        seconds=time.perf_counter() - started,
    )
