"""Perplexity work as segments: a short text whole, a long text as sliding windows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Segment:
    """One forward pass row: `ids` of text number `text`, targets scored from `first` on."""

    text: int
    ids: tuple[int, ...]
    first: int

    @property
    def n_targets(self) -> int:
        """Targets this segment scores."""
        return len(self.ids) - self.first


def windows(n_ids: int, context: int, stride: int) -> list[tuple[int, int, int]]:
    """(begin, end, first scored position counted from begin) of each window over `n_ids` ids."""
    if not 1 <= stride < context:
        raise ValueError(f"stride must be in [1, {context - 1}], got {stride}")
    if n_ids <= context:
        return [(0, n_ids, 1)]
    # A later window starts `stride` ids after the previous one, which ended `context` ids after
    # its start; the last is the first to reach the end.
    return [
        (begin, min(begin + context, n_ids), context - stride if begin else 1)
        for begin in range(0, n_ids - context + stride, stride)
    ]


def make_segments(
    token_ids: Sequence[Sequence[int]], bos_id: int, context: int, stride: int
) -> list[Segment]:
    """Segments of every text (BOS prepended), in text order; texts must not be empty."""
    segments: list[Segment] = []
    for index, tokens in enumerate(token_ids):
        ids = (bos_id, *tokens)
        for begin, end, first in windows(len(ids), context, stride):
            segments.append(Segment(index, ids[begin:end], first))
    return segments


def sort_longest_first(segments: Sequence[Segment]) -> list[Segment]:
    """Segments by length, longest first; ties keep their order (so the order is reproducible)."""
    return sorted(segments, key=lambda s: -len(s.ids))


def plan_batches(ordered: Sequence[Segment], token_budget: int) -> list[range]:
    """Consecutive batches of the sorted segments, each within `token_budget`."""
    batches, start = [], 0
    while start < len(ordered):
        stop = min(len(ordered), start + batch_size_for(len(ordered[start].ids), token_budget))
        batches.append(range(start, stop))
        start = stop
    return batches


def batch_size_for(longest: int, token_budget: int) -> int:
    """Rows a batch may hold when its longest row has `longest` ids (at least one)."""
    return max(1, token_budget // longest)
