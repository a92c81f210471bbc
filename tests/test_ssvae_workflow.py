"""The SSVAE grid end to end through Snakemake: plans of a tiny grid of the embedded digits
(`.test/ssvae`), and the results of the session's finished run of every family."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.conftest import job_counts, tiny_config
from tests.figures import assert_drawn_figure

TINY = tiny_config("ssvae")


def with_train(**changes):
    config = tiny_config("ssvae")
    config["ssvae"]["train"].update(changes)
    return config


@pytest.mark.workflow
def test_stacked_mode_trains_all_seeds_of_a_grid_point_in_one_job_and_per_run_mode_one_each(
    tmp_path, run_snakemake
):
    stacked = run_snakemake(tmp_path / "stacked", TINY, "-n")
    assert job_counts(stacked.stdout)["ssvae_train"] == 2  # 2 fractions x 1 rate x 1 alpha
    assert stacked.stdout.count("alpha~10/seed~1/metrics.json") >= 2
    per_run = run_snakemake(tmp_path / "runs", with_train(stack="none"), "-n")
    assert job_counts(per_run.stdout)["ssvae_train"] == 4
    assert job_counts(per_run.stdout)["ssvae_baseline"] == 2


@pytest.mark.workflow
def test_the_tiny_grid_runs_to_tables_figures_and_a_summary(finished_all):
    """The grid of the session's finished run of every family (`.test/all`): 5% and 10% of the
    4,000 training digits labelled, half of those labels corrupted, 2 seeds, 6 epochs."""
    root = finished_all / "results" / "ssvae"
    metrics = json.loads((root / "frac~0.05/corrupt~0.5/alpha~1/seed~1/metrics.json").read_text())
    assert metrics["n_labelled"] == 200 and metrics["n_corrupted"] == 100
    assert len(metrics["curve"]) == 6 and metrics["run_record"]["devices"] == ["cpu"]
    assert metrics["timing"]["samples_per_s"] > 0
    assert not list((root / "jobs").rglob("*.state.pt")), "states go once the run accepts them"
    runs = pd.read_csv(root / "runs.csv")
    assert len(runs) == 4 + 4 and set(runs["model"]) == {"m2", "baseline"}
    assert runs.loc[runs["model"] == "m2", "gain_over_baseline"].notna().all()
    summary = pd.read_csv(root / "summary.csv")
    assert (summary["n_seeds"] == 2).all()
    text = (root / "summary.md").read_text()
    assert "| fraction | labels | M2 α=1 | baseline |" in text
    for name in (
        "accuracy_vs_fraction",
        "alpha_fraction_heatmap",
        "corruption_effect",
        "m2_vs_baseline",
    ):
        assert_drawn_figure(root / "figures" / f"{name}.png")


@pytest.mark.workflow
def test_a_missing_idx_folder_plans_in_a_dry_run_but_stops_before_any_job(tmp_path, run_snakemake):
    config = tiny_config("ssvae")
    config["ssvae"]["data"] = {"source": "idx", "path": str(tmp_path / "no-mnist-here")}
    assert run_snakemake(tmp_path, config, "-n").returncode == 0
    result = run_snakemake(tmp_path, config, check=False)
    assert result.returncode != 0
    assert "no-mnist-here: no such folder" in result.stderr
    assert not (tmp_path / "results").exists()
