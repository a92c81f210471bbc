"""The timeline rule in a real run (the session's finished run of every family on `.test/all`):
it draws every attempt of every job the run's records hold, named by its rule, after every other
job, and runs again only when one of the run's final outputs changes."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pandas as pd

from gpuflow.job.record_attempts import recorded_attempts
from gpuflow.ops.timeline import read_records
from tests.conftest import job_counts, snakemake, tiny_config

TIMELINE = Path("results/timeline")


def test_the_run_s_timeline_has_one_bar_per_attempt_of_each_job_named_by_its_rule(finished_all):
    bars = pd.read_csv(finished_all / TIMELINE / "attempts.csv", keep_default_na=False)
    records = read_records(finished_all / "results")
    expected = sorted(
        (record["outputs"][0], number, attempt["started"])
        for record in records
        for number, attempt in enumerate(recorded_attempts(record), start=1)
        for _ in attempt["gpus"] or [None]
    )
    drawn = sorted(zip(bars["job"], bars["attempt"], bars["start"], strict=True))
    assert [d[:2] for d in drawn] == [e[:2] for e in expected]
    assert [d[2] for d in drawn] == [e[2] for e in expected]
    rules = set(bars["rule"])
    assert {
        "ssvae_train",
        "ssvae_baseline",
        "sweep_tables",
        "fluency_tables",
        "scaling_train",
    } <= rules
    assert all(rule.isidentifier() for rule in rules), rules
    assert bars["start"].max() <= os.stat(finished_all / TIMELINE / "timeline.png").st_mtime
    for _, lane in bars.groupby("lane"):
        lane = lane.sort_values("start")
        assert (lane["start"].to_numpy()[1:] >= lane["end"].to_numpy()[:-1]).all(), lane


def test_the_timeline_runs_again_when_a_final_output_changes_and_nothing_else(
    finished_all, tmp_path
):
    config = tiny_config("all")
    assert "Nothing to be done" in snakemake(finished_all, config, "--dry-run").stdout
    workdir = tmp_path / "work"
    shutil.copytree(finished_all, workdir, symlinks=True)
    # a newer file of the same content is no change (Snakemake compares small files' checksums)
    with open(workdir / "results/sweep/tables.html", "a", encoding="utf-8") as table:
        table.write("<!-- changed -->\n")
    assert job_counts(snakemake(workdir, config, "--dry-run").stdout) == {"timeline": 1, "all": 1}
