"""Training jobs that SLURM ends early, on the live cluster: at their time limit, cancelled, or
requeued as on preemption.

SLURM ends the job with SIGTERM (then SIGKILL after KillWait); the step finishes the epoch in
progress, saves its state and stops. The profile retries a timed-out or cancelled job with more
time; a requeued job starts again by itself. Either way the next run resumes from the saved
state, never redoing a finished epoch, to the numbers of an uninterrupted run.
"""

from __future__ import annotations

import json
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import snakemake, tiny_config
from tests.slurm import harness

pytestmark = [pytest.mark.slurm, pytest.mark.workflow]
pytest_plugins = ["tests.slurm.fixtures"]

SSVAE = "results/ssvae/frac~0.2/corrupt~0.0/alpha~10/seed~0/metrics.json"
LOG = "results/ssvae/logs/train/frac~0.2/corrupt~0.0/alpha~10.log"
STATE = "results/ssvae/frac~0.2/corrupt~0.0/alpha~10/train_state.pt"
LONG = 150  # epochs of about 1 s here: the first attempt's 1-minute limit cannot hold them
SHORT = 40  # epochs of a job that is ended from outside once it has saved one


def ssvae_only(epochs: int, runtime: int) -> dict[str, Any]:
    config = tiny_config("slurm")
    config["families"] = ["ssvae"]
    config["ssvae"]["train"]["epochs"] = epochs
    config["ssvae"]["resources"]["ssvae_train"]["runtime"] = runtime
    return config


@pytest.fixture(scope="module")
def uninterrupted_short(tmp_path_factory) -> Path:
    """The SHORT training run with Snakemake's local scheduler, never ended early."""
    local = tmp_path_factory.mktemp("uninterrupted")
    snakemake(local, ssvae_only(SHORT, runtime=10), SSVAE)
    return local


def training_jobs(workdir: Path) -> list[dict[str, str]]:
    """This run's ssvae_train jobs (squeue keeps ended ones a while): id and state, oldest first."""
    listed = subprocess.run(
        ["squeue", "--states=all", "--noheader", "--format=%i|%T|%k|%Z"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    jobs = []
    for line in listed.splitlines():
        job_id, state, comment, directory = line.strip().split("|", 3)
        if comment.startswith("rule_ssvae_train") and Path(directory) == workdir:
            jobs.append({"id": job_id, "state": state})
    return sorted(jobs, key=lambda job: int(job["id"]))


def comparable(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metrics.items() if k not in ("timing", "run_record")}


def run_on_the_cluster(workdir: Path, config: dict[str, Any], **ending: Any) -> Path:
    """The target through the SLURM profile, its job ended early as `ending` says."""
    result, ended = harness.run_profile(
        workdir, harness.REPO / "Snakefile", config, SSVAE, **ending
    )
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-8000:]}"
    if ending:
        assert ended, "the job was never ended early"
    return workdir


def assert_resumed_to_the_uninterrupted_numbers(cluster: Path, local: Path, epochs: int) -> None:
    """The last run's log resumes after a saved epoch and redoes none; the metrics are equal."""
    log = (cluster / LOG).read_text()
    resumed = re.findall(r"resumed from \S+ after epoch (\d+)", log)
    assert resumed, log[-3000:]
    first = int(resumed[0])
    assert 1 <= first < epochs
    epochs_run = [int(e) for e in re.findall(rf"^epoch (\d+)/{epochs}", log, re.M)]
    assert epochs_run[0] == first + 1, "the run starts after the saved epoch, redoing none"
    assert epochs_run[-1] == epochs
    metrics = json.loads((cluster / SSVAE).read_text())
    assert metrics["timing"]["resumed_from_epoch"] >= first
    assert comparable(metrics) == comparable(json.loads((local / SSVAE).read_text()))
    assert not (cluster / STATE).exists(), "the state goes once the metrics are written"


def test_a_job_stopped_at_its_time_limit_is_retried_with_more_time_and_resumes(
    slurm_cluster, tmp_path
):
    config = ssvae_only(LONG, runtime=1)
    with ThreadPoolExecutor(max_workers=1) as pool:
        uninterrupted = pool.submit(snakemake, tmp_path / "local", config, SSVAE)
        cluster = run_on_the_cluster(tmp_path / "cluster", config)
        uninterrupted.result()
    states = [job["state"] for job in training_jobs(cluster)]
    assert "TIMEOUT" in states and states.count("COMPLETED") == 1, states
    assert_resumed_to_the_uninterrupted_numbers(cluster, tmp_path / "local", LONG)


def test_a_cancelled_training_job_is_retried_and_resumes(
    slurm_cluster, uninterrupted_short, tmp_path
):
    cluster = run_on_the_cluster(
        tmp_path, ssvae_only(SHORT, runtime=10), cancel_rule="ssvae_train", cancel_after=STATE
    )
    states = [job["state"] for job in training_jobs(cluster)]
    assert "CANCELLED" in states and states.count("COMPLETED") == 1, states
    assert_resumed_to_the_uninterrupted_numbers(cluster, uninterrupted_short, SHORT)


def test_a_preempted_training_job_is_requeued_and_resumes_in_the_same_job(
    slurm_cluster, uninterrupted_short, tmp_path
):
    cluster = run_on_the_cluster(
        tmp_path,
        ssvae_only(SHORT, runtime=10),
        cancel_rule="ssvae_train",
        cancel_after=STATE,
        cancel_command=("scontrol", "requeue"),
    )
    jobs = training_jobs(cluster)
    assert [job["state"] for job in jobs] == ["COMPLETED"], "one job, requeued, no retry"
    assert harness.slurm_job(jobs[0]["id"])["Restarts"] == "1"
    assert_resumed_to_the_uninterrupted_numbers(cluster, uninterrupted_short, SHORT)
