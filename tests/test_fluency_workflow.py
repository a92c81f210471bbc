"""The fluency-toxicity family end to end, through the real Snakemake workflow.

Its results come from the session's finished run of every family (`finished_all`, on
`.test/all`): 60 reviews and their shuffled twins scored by a GPT-2 (context 64) trained for
250 steps.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import snakemake, tiny_config
from tests.figures import assert_drawn_figure

TINY_ALL = tiny_config("all")


@pytest.mark.workflow
def test_the_family_writes_scores_stats_figures_and_a_report(finished_all: Path):
    results = finished_all / "results" / "fluency"
    scores = pd.read_csv(results / "scores.csv")
    assert len(scores) == 2 * TINY_ALL["fluency"]["texts"]["n_texts"]  # originals and twins
    assert scores["text_id"].is_unique
    assert (scores["ppl"] > 1).all() and (scores["n_tokens"] > 0).all()
    assert scores["toxicity"].between(0, 1).all()
    for figure in ("logppl_vs_toxicity", "binned_means", "by_group"):
        assert_drawn_figure(results / "figures" / f"{figure}.png")
    summary = json.loads((results / "perplexity_summary.json").read_text())
    assert f"{summary['corpus_ppl']:.2f}" in (results / "summary.md").read_text()
    leftovers = list((finished_all / "results").rglob(".*.tmp-*"))
    assert not leftovers, "temporary files were left behind"


@pytest.mark.workflow
def test_shuffled_twins_are_less_fluent_than_their_originals(finished_all: Path):
    """The tiny LM knows word order: shuffling raises perplexity, by a fifth at least on average
    (an order-blind or untrained scorer gives x1.0). A few short snippets may tie."""
    scores = pd.read_csv(finished_all / "results" / "fluency" / "scores.csv")
    pairs = scores.pivot(index="pair_id", columns="condition", values="ppl")
    share = (pairs["shuffled"] > pairs["original"]).mean()
    assert share >= 0.9, f"only {share:.0%} of shuffled twins score a higher perplexity"
    ratio = float(np.exp(np.log(pairs["shuffled"] / pairs["original"]).mean()))
    assert ratio >= 1.2, f"shuffling raised perplexity only x{ratio:.2f} on average"


BAD_CONFIGS = {
    "a string where a number belongs": (
        {"perplexity": {"shards": "two"}},
        "config key 'fluency.perplexity.shards'",
        "is not of type 'integer'",
    ),
    "an unknown key": ({"shard": 2}, "config key 'fluency'", "'shard' was unexpected"),
    "a negative size": (
        {"texts": {"n_texts": -3}},
        "config key 'fluency.texts.n_texts'",
        "less than the minimum",
    ),
    "a missing model": (
        {"lm": {"path": "/nowhere/gpt2-large"}},
        "config key 'fluency.lm.path'",
        "neither a local model folder nor a model id in the cache",
    ),
    "files without any file": (
        {"texts": {"source": "files"}},
        "config key 'fluency.texts.files'",
        "empty",
    ),
    "heads that do not split the width": (
        {"lm": {"train": {"n_embd": 130, "n_head": 4}}},
        "config key 'fluency.lm.train.n_head'",
        "4 does not divide n_embd=130",
    ),
    "a group column the workflow writes itself": (
        {"texts": {"source": "files", "files": ["t.csv"], "group_columns": ["text_id"]}},
        "config key 'fluency.texts.group_columns'",
        "'text_id' clashes with a column the workflow writes itself",
    ),
    "a text file that is not there": (
        {"texts": {"source": "files", "files": ["gone.csv"]}},
        "config key 'fluency.texts.files'",
        "no such file(s): ['gone.csv']",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_a_bad_config_stops_before_any_job_and_names_the_key(tmp_path: Path, case: str):
    change, key, problem = BAD_CONFIGS[case]
    result = snakemake(tmp_path, {"families": ["fluency"], "fluency": change}, check=False)
    assert result.returncode != 0
    assert key in result.stderr and problem in result.stderr
    assert not (tmp_path / "results").exists()
