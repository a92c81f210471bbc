"""Toxicity scores: the shipped proxy classifier, and any local sequence-classification model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

from gpuflow.errors import ConfigError, GpuflowError
from gpuflow.fluency.toxicity import (
    huggingface_scorer,
    length_batches,
    profanity_scorer,
    toxic_label_index,
)

TEXTS = ["what a lovely film", "you are a stupid idiot and I hate you", "fine acting"]


def huggingface_scores(
    texts: list[str], model_ref: str, toxic_label: str, batch_size: int
) -> tuple[np.ndarray, str]:
    """Scores of `texts` in the step's batches (longest first), back in input order."""
    score, name = huggingface_scorer(model_ref, toxic_label, torch.device("cpu"))
    scores = np.zeros(len(texts), dtype=np.float64)
    for chosen in length_batches(texts, batch_size):
        scores[chosen] = score([texts[i] for i in chosen])
    return scores, name


def test_the_proxy_scores_insults_higher_and_names_itself_a_proxy():
    score, name = profanity_scorer()
    scores = score(TEXTS)
    assert scores.shape == (3,)
    assert scores[1] > 0.5 > max(scores[0], scores[2])
    assert "proxy" in name


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory) -> Path:
    """A tiny, randomly initialised BERT classifier with labels non-toxic / toxic, saved locally."""
    folder = tmp_path_factory.mktemp("classifier")
    words = sorted({w for t in TEXTS for w in t.split()})
    vocab = {"[PAD]": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(words)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", unk_token="[UNK]")
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
        id2label={0: "non-toxic", 1: "toxic"},
        label2id={"non-toxic": 0, "toxic": 1},
    )
    BertForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_a_local_classifier_gives_the_toxic_label_probability_in_input_order(classifier_dir):
    batched, name = huggingface_scores(TEXTS, str(classifier_dir), "TOXIC", 2)
    one_by_one = [huggingface_scores([t], str(classifier_dir), "toxic", 1)[0][0] for t in TEXTS]
    np.testing.assert_allclose(batched, one_by_one, rtol=1e-5)
    assert ((batched > 0) & (batched < 1)).all()
    assert str(classifier_dir) in name


def test_an_unknown_toxic_label_lists_the_model_labels():
    with pytest.raises(ConfigError, match=r"'hateful' is not a label.*\['non-toxic', 'toxic'\]"):
        toxic_label_index({"non-toxic": 0, "toxic": 1}, "hateful")


def test_a_folder_without_a_classifier_is_a_clear_error(tmp_path: Path):
    with pytest.raises(GpuflowError, match="cannot load a sequence-classification model"):
        huggingface_scorer(str(tmp_path), "toxic", torch.device("cpu"))


def test_the_cli_writes_one_score_per_text_with_the_scorer_name(tmp_path: Path, run_gpuflow):
    texts = tmp_path / "shard.csv"
    pd.DataFrame({"text_id": ["a", "b", "c"], "text": TEXTS}).to_csv(texts, index=False)
    out = tmp_path / "tox.csv"
    run_gpuflow("toxicity", "--texts", str(texts), "--out", str(out))
    scores = pd.read_csv(out)
    assert scores["text_id"].tolist() == ["a", "b", "c"]
    assert scores["toxicity_scorer"].str.contains("proxy").all()
    record = json.loads((tmp_path / "tox.run.json").read_text())
    assert record["devices"] == ["cpu"] and record["texts"] == 3
    assert {"host", "slurm_job_id", "cuda_visible_devices"} <= record.keys()


def test_a_text_id_given_twice_is_refused_naming_both_rows_before_scoring(
    tmp_path: Path, run_gpuflow
):
    texts = tmp_path / "shard.csv"
    pd.DataFrame({"text_id": ["a", "b", "a"], "text": TEXTS}).to_csv(texts, index=False)
    out = tmp_path / "tox.csv"
    result = run_gpuflow("toxicity", "--texts", str(texts), "--out", str(out), check=False)
    assert result.returncode == 2
    assert f"{texts}, row 4: text id 'a' again (first at row 2)" in result.stderr
    assert not out.exists()
