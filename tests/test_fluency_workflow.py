"""The fluency-toxicity family end to end, through the real Snakemake workflow."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import job_counts, snakemake, tiny_config
from tests.figures import assert_drawn_figure

TINY = tiny_config("fluency")


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A workflow run of the tiny fluency config, shared by the tests below."""
    workdir = tmp_path_factory.mktemp("fluency")
    snakemake(workdir, TINY)
    return workdir


@pytest.mark.workflow
def test_the_family_writes_scores_stats_figures_and_a_report(finished: Path):
    results = finished / "results" / "fluency"
    scores = pd.read_csv(results / "scores.csv")
    assert len(scores) == 120 and scores["text_id"].is_unique
    assert (scores["ppl"] > 1).all() and (scores["n_tokens"] > 0).all()
    assert scores["toxicity"].between(0, 1).all()
    for figure in ("logppl_vs_toxicity", "binned_means", "by_group"):
        assert_drawn_figure(results / "figures" / f"{figure}.png")
    summary = json.loads((results / "perplexity_summary.json").read_text())
    assert f"{summary['corpus_ppl']:.2f}" in (results / "summary.md").read_text()
    assert not list(finished.rglob(".*.tmp-*")), "temporary files were left behind"


@pytest.mark.workflow
def test_shuffled_twins_are_less_fluent_than_their_originals(finished: Path):
    scores = pd.read_csv(finished / "results" / "fluency" / "scores.csv")
    pairs = scores.pivot(index="pair_id", columns="condition", values="ppl")
    share = (pairs["shuffled"] > pairs["original"]).mean()
    assert share >= 0.95, f"only {share:.0%} of shuffled twins score a higher perplexity"


@pytest.mark.workflow
def test_a_finished_run_has_nothing_left_to_do(finished: Path):
    dry = snakemake(finished, TINY, "--dry-run")
    assert "Nothing to be done" in dry.stdout + dry.stderr


@pytest.mark.workflow
def test_a_failed_shard_is_rerun_alone(finished: Path):
    results = finished / "results" / "fluency"
    failed = results / "perplexity" / "shard~1.csv"
    kept = results / "perplexity" / "shard~0.csv"
    kept_mtime = kept.stat().st_mtime_ns
    downstream = ["scores.csv", "perplexity_summary.json", "stats", "figures", "summary.md"]
    failed.unlink()
    for name in downstream:
        shutil.rmtree(results / name) if (results / name).is_dir() else (results / name).unlink()
    dry = snakemake(finished, TINY, "--dry-run")
    counts = job_counts(dry.stdout + dry.stderr)
    assert counts["fluency_perplexity"] == 1
    assert not {"fluency_train_lm", "fluency_texts", "fluency_toxicity"} & set(counts)
    snakemake(finished, TINY)
    assert failed.exists() and kept.stat().st_mtime_ns == kept_mtime


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


@pytest.mark.workflow
def test_the_snakemake_report_holds_every_fluency_figure(finished: Path):
    snakemake(finished, TINY, "--report", "report.html")
    html = (finished / "report.html").read_text(errors="replace")
    for figure in ("logppl_vs_toxicity.png", "binned_means.png", "by_group.png", "summary.md"):
        assert figure in html
    assert "Fluency-toxicity" in html
