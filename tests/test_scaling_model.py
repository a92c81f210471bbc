"""The classifier hands attention its padding mask in the dtype the matmuls run in.

Under bf16/fp16 autocast a boolean padding mask became an fp32 additive mask beside bf16/fp16
queries, which CUDA's memory-efficient attention kernel does not take (the math kernel ran
instead). In fp32 the model computes exactly what the boolean mask gave.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gpuflow.scaling.model import TextClassifier


def model_and_batch(dropout: float = 0.0) -> tuple[TextClassifier, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = TextClassifier(300, 2, 32, 4, 2, 64, 24, dropout)
    ids = torch.randint(1, 300, (4, 20))
    ids[0, 10:] = 0
    ids[2, 3:] = 0
    return model, ids, ids != 0


def boolean_mask_forward(model: TextClassifier, ids: torch.Tensor, mask: torch.Tensor):
    """The forward pass with the boolean padding mask, as the model ran before."""
    positions = torch.arange(ids.shape[1])
    hidden = model.token(ids) + model.position(positions)[None]
    hidden = model.norm(model.encoder(hidden, src_key_padding_mask=~mask))
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    return model.head((hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_under_autocast_attention_gets_queries_and_padding_mask_in_one_dtype(dtype, monkeypatch):
    model, ids, mask = model_and_batch(dropout=0.1)
    calls = []
    attention = F.scaled_dot_product_attention

    def seen(query, key, value, attn_mask=None, *args, **kwargs):
        calls.append((query.dtype, attn_mask.dtype))
        return attention(query, key, value, attn_mask, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", seen)
    with torch.autocast("cpu", dtype=dtype):
        model(ids, mask).float().sum().backward()
    assert calls == [(dtype, dtype)] * 2  # one call per layer


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_in_fp32_the_logits_are_exactly_those_of_the_boolean_mask(train):
    model, ids, mask = model_and_batch()
    model.train(train)
    with torch.no_grad():
        assert torch.equal(model(ids, mask), boolean_mask_forward(model, ids, mask))
        padded = ids.masked_fill(~mask, 7)  # what stands on padded positions is never seen
        assert torch.equal(model(padded, mask), model(ids, mask))


def test_under_bf16_autocast_the_logits_stay_close_to_the_boolean_mask_ones():
    model, ids, mask = model_and_batch()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ours, before = model(ids, mask).float(), boolean_mask_forward(model, ids, mask).float()
    torch.testing.assert_close(ours, before, rtol=0, atol=2e-2)


def test_padding_past_the_longest_text_changes_no_logit():
    """Why batches may be padded to a multiple of 64 on GPUs (gpuflow.scaling.kernels)."""
    model, ids, mask = model_and_batch()
    longer = F.pad(ids, (0, 4))
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(longer, longer != 0), model(ids, mask), rtol=0, atol=1e-6)
