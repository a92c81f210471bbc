"""The sweep family as a Snakemake workflow: shards, a tidy table, figures, the paper's plan.

The shards, table and figures are those of the session's finished run of every family
(`finished_all`, on `.test/all`: 4 seeds in shards of 3, both methods).
"""

from __future__ import annotations

import re

import pandas as pd
import pytest
import yaml

from gpuflow.job.paths import STATE, job_file
from tests.conftest import REPO, tiny_config
from tests.figures import assert_drawn_figure


def planned_jobs(stdout: str) -> dict[str, int]:
    """Job counts per rule from a dry run's table."""
    return {rule: int(n) for rule, n in re.findall(r"^(\w+)\s+(\d+)$", stdout, re.MULTILINE)}


@pytest.mark.workflow
def test_the_sweep_runs_end_to_end_into_one_table_and_figures(finished_all):
    results = finished_all / "results/sweep"
    table = pd.read_csv(results / "table.csv")
    assert len(table) == 2 * 4  # methods x seeds, from 2 shards per method
    for method, rows in table.groupby("method"):
        assert sorted(rows["seed"]) == [0, 1, 2, 3], method
    assert table["test_error"].notna().all()
    assert (table.loc[table["method"] == "gnc", "guesses"] >= 1).all()
    summary = pd.read_csv(results / "summary.csv")
    assert set(summary["method"]) == {"gd", "gnc"}
    for figure in ("test_error", "guesses"):
        assert_drawn_figure(results / f"figures/{figure}.png")
    shard_dir = results / "shards/method~gd/rank~2/width~4"
    assert (shard_dir / "shard~1.csv").is_file()
    assert not job_file(shard_dir / "shard~1.csv", STATE).exists(), (
        "the resume state goes with the table"
    )
    log = (results / "logs/method~gd/rank~2/width~4/shard~0.log").read_text()
    assert "3/3" in log, "the progress bar is in the log"


@pytest.mark.workflow
def test_the_paper_config_plans_3_ranks_x_3_widths_x_100_seeds_x_2_methods_in_shards(
    tmp_path, run_snakemake
):
    paper = yaml.safe_load((REPO / "config/paper.yaml").read_text())
    result = run_snakemake(tmp_path, {"families": ["sweep"], "sweep": paper["sweep"]}, "-n")
    jobs = planned_jobs(result.stdout)
    shards_per_cell = -(-100 // paper["sweep"]["shard_size"])
    assert jobs["sweep_shard"] == 3 * 3 * 2 * shards_per_cell
    assert "--seeds 75:100" in result.stdout


def test_a_teacher_rank_above_the_dimensions_is_refused_before_any_job(tmp_path, run_snakemake):
    config = tiny_config("sweep")
    config["sweep"]["teacher_ranks"] = [2, 9]
    result = run_snakemake(tmp_path, config, "-n", check=False)
    assert result.returncode != 0
    assert "config key 'sweep.teacher_ranks': rank 9 exceeds" in result.stdout + result.stderr


@pytest.mark.workflow
def test_the_sweep_rank_check_runs_only_when_the_sweep_is_enabled(tmp_path, run_snakemake):
    bad_rank = {"sweep": {"teacher_ranks": [9]}}  # beyond the 8 input dimensions
    enabled = run_snakemake(tmp_path, {"families": ["sweep"], **bad_rank}, "-n", check=False)
    assert enabled.returncode != 0
    assert "config key 'sweep.teacher_ranks'" in enabled.stdout + enabled.stderr
    disabled = run_snakemake(tmp_path, {"families": ["fluency"], **bad_rank}, "-n", check=False)
    assert disabled.returncode == 0, disabled.stderr[-2000:]
