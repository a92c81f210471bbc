"""The LM head with its vocabulary padded to a multiple of 64, for half-precision GEMMs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

MULTIPLE = 64
HALF = (torch.float16, torch.bfloat16)


class PaddedHead(nn.Module):
    """`head`'s linear map padded to a multiple of 64 rows; returns the first `vocab` logits."""

    def __init__(self, head: nn.Linear):
        super().__init__()
        self.vocab = head.out_features
        padded = padded_vocab(self.vocab) - self.vocab
        with torch.no_grad():
            self.weight = nn.Parameter(F.pad(head.weight, (0, 0, 0, padded)), requires_grad=False)
            self.bias = (
                None
                if head.bias is None
                else nn.Parameter(F.pad(head.bias, (0, padded)), requires_grad=False)
            )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = F.linear(hidden.to(self.weight.device), self.weight, self.bias)
        return logits[..., : self.vocab]


def padded_vocab(vocab: int) -> int:
    """`vocab` rounded up to a multiple of 64."""
    return vocab + -vocab % MULTIPLE


def pads(head: nn.Module | None, dtype: torch.dtype) -> bool:
    """Whether scoring pads `head` in `dtype`: half precision, vocabulary not a multiple of 64."""
    return type(head) is nn.Linear and dtype in HALF and head.out_features % MULTIPLE != 0


def padded_head_bytes(head: nn.Module | None, dtype: torch.dtype) -> int:
    """Bytes of the PaddedHead's own weight copy of `head` in `dtype` (0 where it is not padded)."""
    if not pads(head, dtype):
        return 0
    return padded_vocab(head.out_features) * head.in_features * dtype.itemsize


def pad_lm_head(model: nn.Module) -> nn.Module:
    """`model` with its output embeddings replaced by a PaddedHead where `pads` says so."""
    head = model.get_output_embeddings()
    weight = getattr(head, "weight", None)  # none where the model has no output embeddings
    if weight is not None and weight.device.type != "meta" and pads(head, weight.dtype):
        model.set_output_embeddings(PaddedHead(head))
    return model
