"""A half-precision LM head over a vocabulary that is not a multiple of 64 is padded for aligned
GEMMs (an H100 ran GPT-2's 50,257-row head at 94 TFLOP/s unpadded), computing the same logits."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpuflow.fluency.ppl_model import PaddedHead, pad_lm_head, prepare_for_scoring
from gpuflow.fluency.ppl_scoring import model_forward


def gpt2(vocab: int, dtype: torch.dtype) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=1, n_embd=32, n_head=2, vocab_size=vocab, n_positions=16, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    return GPT2LMHeadModel(config).to(dtype).eval()


def test_a_bf16_head_over_an_odd_vocabulary_is_padded_to_64_and_gives_the_same_logits():
    model = gpt2(501, torch.bfloat16)
    hidden = torch.randn(7, 32).to(torch.bfloat16)
    with torch.no_grad():
        plain = model.get_output_embeddings()(hidden)
    head = pad_lm_head(model).get_output_embeddings()
    assert isinstance(head, PaddedHead)
    assert head.weight.shape == (512, 32) and not head.weight[501:].any()
    with torch.no_grad():
        padded = head(hidden)
    assert padded.shape == (7, 501)
    torch.testing.assert_close(padded, plain, rtol=0, atol=0)


def test_the_scoring_forward_returns_the_scored_positions_logits_through_the_padded_head():
    model = gpt2(501, torch.bfloat16)
    ids = torch.randint(1, 501, (2, 9))
    scored = torch.zeros(2, 9, dtype=torch.bool)
    scored[0, 2:8], scored[1, 1:4] = True, True
    prepared = prepare_for_scoring(model, "eager")
    assert isinstance(prepared.get_output_embeddings(), PaddedHead)
    with torch.no_grad():
        logits = model_forward(prepared)(ids, scored)
        whole = prepared(ids).logits
    assert logits.shape == (9, 501)
    torch.testing.assert_close(logits, whole[scored], rtol=0, atol=0)


@pytest.mark.parametrize(("vocab", "dtype"), [(501, torch.float32), (512, torch.bfloat16)])
def test_fp32_heads_and_aligned_vocabularies_are_left_as_they_are(vocab, dtype):
    model = gpt2(vocab, dtype)
    head = model.get_output_embeddings()
    assert pad_lm_head(model).get_output_embeddings() is head
