"""Merging shards: every text exactly once from each scorer, and perplexity summarised right."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from gpuflow.errors import DataError
from gpuflow.fluency.merge import PERPLEXITY_COLUMNS, join_scores, read_shards, summarise

TEXTS = pd.DataFrame(
    {"text_id": ["a", "b", "c"], "text": ["x y", "y z", "z"], "condition": ["o", "s", "o"]}
)
PPL = pd.DataFrame(
    {
        "text_id": ["a", "b", "c"],
        "nll_sum": [2.0, 6.0, 1.0],
        "n_tokens": [2, 3, 1],
        "ppl": [math.e, math.e**2, math.e],
    }
)
TOX = pd.DataFrame(
    {"text_id": ["c", "b", "a"], "toxicity": [0.3, 0.2, 0.1], "toxicity_scorer": "p"}
)


def test_scores_join_on_text_id_whatever_the_shard_order():
    scores = join_scores(TEXTS, PPL, TOX, "texts.csv")
    assert scores.set_index("text_id")["toxicity"].to_dict() == {"a": 0.1, "b": 0.2, "c": 0.3}


def test_corpus_perplexity_weights_tokens_not_texts():
    summary = summarise(join_scores(TEXTS, PPL, TOX, "t.csv"), "lm", ["condition"])
    assert summary["corpus_ppl"] == pytest.approx(math.exp(9.0 / 6))
    assert summary["mean_text_ppl"] == pytest.approx((2 * math.e + math.e**2) / 3)
    assert summary["by_group"]["condition"]["o"]["corpus_ppl"] == pytest.approx(math.exp(3 / 3))
    assert summary["by_group"]["condition"]["s"]["n_tokens"] == 3


def test_a_text_without_a_score_is_an_error_not_a_shorter_table():
    with pytest.raises(DataError, match=r"1 texts have no perplexity score \(first: \['c'\]\)"):
        join_scores(TEXTS, PPL.iloc[:2], TOX, "texts.csv")


def test_a_text_scored_in_two_shards_names_the_shard(tmp_path):
    first, second = tmp_path / "s0.csv", tmp_path / "s1.csv"
    PPL.iloc[:2].to_csv(first, index=False)
    PPL.iloc[1:].to_csv(second, index=False)
    with pytest.raises(DataError, match=r"s0.csv: text id 'b' scored twice for perplexity"):
        read_shards([str(first), str(second)], "perplexity", PERPLEXITY_COLUMNS)


BAD_SHARDS = {
    "a missing column": ("text_id,ppl\na,3.5\n", r"p.csv: no \['nll_sum', 'n_tokens'\] column"),
    "a value that is no number": (
        "text_id,nll_sum,n_tokens,ppl\na,2.0,3,1.9\nb,lots,3,2.0\n",
        r"p.csv, row 3: nll_sum 'lots' is not a finite number",
    ),
    "an empty file": ("", r"p.csv: cannot read the perplexity shard"),
}


@pytest.mark.parametrize("case", sorted(BAD_SHARDS))
def test_a_malformed_shard_is_an_error_naming_the_file_and_row(tmp_path, case):
    content, message = BAD_SHARDS[case]
    shard = tmp_path / "p.csv"
    shard.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match=message):
        read_shards([str(shard)], "perplexity", PERPLEXITY_COLUMNS)
