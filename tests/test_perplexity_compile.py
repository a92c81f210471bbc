"""fluency.perplexity.compile: the scoring model through torch.compile, the same numbers.

The model is compiled before its first batch (so compiling is neither timed as scoring nor met
mid-job) and a node that cannot compile fails at once, naming the key. The scored model has the
shape of gpu-check's CPU smoke test: tests/conftest.py runs both modules in one process, where
torch.compile's in-process cache lets the second reuse the first one's compiled graphs (the
cache is guarded by the thread count, so these tests keep the default, as that one does).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch._dynamo.utils import counters

from benchmarks.gpu_check.perplexity_check import BOS, random_texts, save_random_lm
from benchmarks.gpu_check.sizes import tiny_sizes
from gpuflow.errors import ConfigError
from gpuflow.fluency.perplexity import score_token_ids, scoring_settings
from gpuflow.fluency.ppl_workers import compiled_forward

LM = tiny_sizes().lm


@pytest.fixture(scope="module")
def check_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random GPT-2 of gpu-check's tiny shape."""
    folder = tmp_path_factory.mktemp("check-lm")
    save_random_lm(folder, LM, torch.device("cpu"))
    return folder


class TwoLayerLM(torch.nn.Module):
    """The smallest model with a causal LM's scoring interface (ids in, logits out through an
    output embedding): quick to compile, with the same size-0/1 specialisations as any model."""

    def __init__(self, vocab: int = 50, width: int = 8):
        super().__init__()
        self.embed, self.head = torch.nn.Embedding(vocab, width), torch.nn.Linear(width, vocab)

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.head

    def forward(self, input_ids, attention_mask, use_cache):
        hidden = self.embed(input_ids) * attention_mask[..., None]
        return SimpleNamespace(logits=self.head(hidden))


def compiled_graphs() -> int:
    """Graphs torch.compile has compiled in this process so far."""
    return counters["stats"]["unique_graphs"]


def scores(folder: Path, texts: list[list[int]], compile: bool, wrap_forward=None):
    return score_token_ids(
        texts,
        model=str(folder),
        bos_id=BOS,
        context=LM["n_positions"],
        stride=LM["n_positions"] // 2,
        devices=[torch.device("cpu")],
        settings=scoring_settings(dtype="float32", token_budget=256, compile=compile),
        wrap_forward=wrap_forward,
    )


def test_a_compiled_scorer_gives_the_eager_scores_and_compiles_nothing_while_scoring(
    check_lm, capsys: pytest.CaptureFixture[str]
):
    texts = random_texts(40, 1, 2 * LM["n_positions"], LM["vocab_size"], seed=1)
    graphs_at_batch: list[int] = []

    def counting(forward):
        def counted(input_ids, scored):
            graphs_at_batch.append(compiled_graphs())
            return forward(input_ids, scored)

        return counted

    eager, eager_counts, _ = scores(check_lm, texts, compile=False)
    nll, counts, stats = scores(check_lm, texts, compile=True, wrap_forward=counting)
    assert "perplexity worker on cpu: compiled in" in capsys.readouterr().err
    assert len(graphs_at_batch) > 1 and graphs_at_batch[0] == compiled_graphs()
    assert stats["load_seconds"] > 0 and stats["scoring_seconds"] > 0
    np.testing.assert_array_equal(counts, eager_counts)
    np.testing.assert_allclose(nll, eager, rtol=1e-5)


def test_compiling_meets_every_batch_shape_before_the_first_batch():
    """Dynamic shapes still specialise sizes 0 and 1: a batch of one row, or with one scored
    position, would compile again mid-job unless the warm-up met them."""
    torch._dynamo.reset()
    forward, seconds = compiled_forward(TwoLayerLM(), torch.device("cpu"))
    compiled = compiled_graphs()
    assert seconds > 0
    with torch.inference_mode():
        for rows, length, n_scored in ((4, 9, 30), (1, 17, 5), (3, 6, 1), (1, 5, 1)):
            scored = torch.zeros(rows * length, dtype=torch.bool)
            scored[:n_scored] = True
            ids = torch.randint(0, 50, (rows, length))
            assert forward(ids, scored.view(rows, length)).shape == (n_scored, 50)
    assert compiled_graphs() == compiled
    torch._dynamo.reset()


def test_a_node_that_cannot_compile_fails_at_once_naming_the_key(monkeypatch: pytest.MonkeyPatch):
    import torch._inductor.config as inductor

    torch._dynamo.reset()  # compile afresh: nothing compiled earlier in this process is reused
    monkeypatch.setattr(inductor.cpp, "cxx", (None, "/no/such/c++-compiler"))
    monkeypatch.setattr(inductor, "force_disable_caches", True)
    try:
        with pytest.raises(ConfigError) as refused:
            compiled_forward(TwoLayerLM(), torch.device("cpu"))
    finally:
        torch._dynamo.reset()
    assert refused.value.key == "fluency.perplexity.compile"
    assert "could not compile the scoring model on cpu" in refused.value.problem
    assert "C++ compiler" in str(refused.value)
