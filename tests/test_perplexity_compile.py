"""fluency.perplexity.compile: the scoring model through torch.compile, the same numbers.

The model is compiled before its first batch (so compiling is neither timed as scoring nor met
mid-job) and a node that cannot compile fails at once, naming the key. The tiny GPT-2 of
tests/test_perplexity.py stands in for a real model.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch._dynamo.utils import counters

from gpuflow.cli import main as gpuflow_main
from gpuflow.fluency.perplexity import tokenize
from tests.conftest import files_left
from tests.test_perplexity import load, one_thread_per_job, reviews, score, tiny_lm, write_texts

__all__ = ["one_thread_per_job", "reviews", "tiny_lm"]  # fixtures, shared with test_perplexity


def compiled_graphs() -> int:
    """Graphs torch.compile has compiled in this process so far."""
    return counters["stats"]["unique_graphs"]


def test_a_compiled_scorer_gives_the_eager_scores_and_compiles_before_its_first_batch(
    tiny_lm, reviews
):
    _, tokenizer = load(tiny_lm)
    token_ids, bos = tokenize(tokenizer, reviews), tokenizer.bos_token_id
    before, at_first_batch = compiled_graphs(), []

    def first_batch_sees(forward):
        def seen(input_ids, scored):
            at_first_batch.append(compiled_graphs())
            return forward(input_ids, scored)

        return seen

    eager, eager_counts, _ = score(tiny_lm, token_ids, bos_id=bos, token_budget=256)
    nll, counts, stats = score(
        tiny_lm, token_ids, bos_id=bos, token_budget=256, compile=True,
        wrap_forward=first_batch_sees,
    )  # fmt: skip
    assert at_first_batch and at_first_batch[0] > before  # compiled before the first batch
    assert stats["load_seconds"] > 0 and stats["scoring_seconds"] > 0
    np.testing.assert_array_equal(counts, eager_counts)
    np.testing.assert_allclose(nll, eager, rtol=1e-5)


def perplexity_argv(tiny_lm: Path, tmp_path: Path) -> tuple[list[str], Path]:
    """`gpuflow perplexity` on two short texts with compile on, and its output path."""
    texts = write_texts(tmp_path / "texts.csv", ["a", "b"], ["A fine film.", "Dull and long."])
    out = tmp_path / "ppl.csv"
    runtime = json.dumps({"device": "cpu", "perplexity": {"compile": True}})
    argv = ["perplexity", "--texts", str(texts), "--model", str(tiny_lm), "--out", str(out)]
    return [*argv, "--runtime", runtime], out


def test_the_run_record_says_whether_the_model_was_compiled(tiny_lm, tmp_path):
    argv, out = perplexity_argv(tiny_lm, tmp_path)
    assert gpuflow_main(argv) == 0
    record = json.loads(out.with_suffix(".run.json").read_text())
    assert record["compile"] is True and record["load_seconds"] > 0


def test_a_node_that_cannot_compile_fails_before_scoring_naming_the_key(
    tiny_lm, tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    import torch._inductor.config as inductor

    torch._dynamo.reset()  # compile afresh: nothing compiled earlier in this process is reused
    monkeypatch.setattr(inductor.cpp, "cxx", (None, "/no/such/c++-compiler"))
    monkeypatch.setattr(inductor, "force_disable_caches", True)
    argv, _ = perplexity_argv(tiny_lm, tmp_path)
    try:
        assert gpuflow_main(argv) == 2
    finally:
        torch._dynamo.reset()
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("gpuflow perplexity: error: config key 'fluency.perplexity.compile'")
    assert "could not compile" in error
    assert files_left(tmp_path) == ["texts.csv"]
