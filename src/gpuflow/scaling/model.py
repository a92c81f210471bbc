"""The classifier: token + position embeddings, a pre-norm transformer encoder, mean pooling."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn


class TextClassifier(nn.Module):
    """A transformer encoder classifier over padded token ids (0 = padding)."""

    def __init__(
        self,
        vocab_size: int,
        n_classes: int,
        d_model: int,
        n_heads: int,
        n_layers: int,
        ffn_dim: int,
        max_seq_len: int,
        dropout: float,
    ):
        super().__init__()
        self.token = nn.Embedding(vocab_size, d_model, padding_idx=0)
        self.position = nn.Embedding(max_seq_len, d_model)
        layer = nn.TransformerEncoderLayer(
            d_model, n_heads, ffn_dim, dropout, activation="gelu", batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, n_classes)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Class logits [batch, classes] of `ids` [batch, length]; `mask` marks real tokens."""
        positions = torch.arange(ids.shape[1], device=ids.device)
        hidden = self.token(ids) + self.position(positions)[None]
        padding = padding_mask(mask, compute_dtype(hidden))
        hidden = self.norm(self.encoder(hidden, src_key_padding_mask=padding))
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)
        return self.head(pooled)


def compute_dtype(tensor: torch.Tensor) -> torch.dtype:
    """The dtype matmuls on `tensor` run in: autocast's where it is on, else the tensor's own."""
    device = tensor.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return tensor.dtype


def padding_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive key padding mask (0 on tokens, -inf on padding) in `dtype`."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, -math.inf)


def build_model(settings: dict[str, Any], vocab_size: int, n_classes: int) -> TextClassifier:
    """The classifier of a configuration's `model` settings."""
    keys = ("d_model", "n_heads", "n_layers", "ffn_dim", "max_seq_len", "dropout")
    return TextClassifier(vocab_size, n_classes, **{key: settings[key] for key in keys})


def parameter_counts(model: nn.Module) -> dict[str, int]:
    """Trainable parameters in all, and in the token embedding (most of a small model's bytes)."""
    total = sum(p.numel() for p in model.parameters() if p.requires_grad)
    embedding = sum(p.numel() for n, p in model.named_parameters() if n.startswith("token."))
    return {"total": total, "token_embedding": embedding}
