"""Jobs that SLURM ends early or that fail, on the live cluster, in one run of the real workflow.

One Snakemake run through the SLURM profile shows several things at once:
- an SSVAE training job is requeued as on preemption (`scontrol requeue`, which sends SIGTERM)
  once it has saved an epoch with time to spare (more left than it has run), starts again in
  the same SLURM job and resumes; its limit (1 minute, more on each retry) stops the attempts
  before and after (SIGTERM), the profile retries them with more time (as often as needed),
  and each resumes.
  No epoch is lost or done twice, and the metrics equal an uninterrupted run's;
- a grid of sweep shards (jobs of their own, arrays off) where shard 1 fails once and shard 0 is
  slower than the profile's latency-wait: no finished output of another shard is deleted or
  rewritten (same inode and content), and only the failed shard is submitted again;
- shard 3's job is cancelled after its step wrote its outputs (as a time limit or preemption
  can end a job in its last seconds): Snakemake removes the outputs of the failed job, and the
  retry takes every seed from the progress the step kept instead of computing them again;
- the job records keep every attempt, and `gpuflow timeline` draws each of them, marked.
SLURM ends a job with SIGTERM (then SIGKILL after KillWait); the step finishes the epoch in
progress, saves its state and stops.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from gpuflow.job.paths import RECORD, job_file
from gpuflow.job.paths import STATE as STATE_KIND
from tests.conftest import gpuflow, snakemake, tiny_config
from tests.slurm import grid_faults, harness

pytestmark = [pytest.mark.slurm, pytest.mark.workflow]
pytest_plugins = ["tests.slurm.fixtures"]

SSVAE = "results/ssvae/frac~0.2/corrupt~0.0/alpha~10/seed~0/metrics.json"
LOG = "results/ssvae/logs/train/frac~0.2/corrupt~0.0/alpha~10.log"
STATE = "results/ssvae/jobs/frac~0.2/corrupt~0.0/alpha~10/seed~0/metrics.json.state.pt"
EPOCHS = 60  # of at least 1.2 s each (grid_faults' epoch floor): a 1-minute limit cannot hold them
SHARDS = "results/sweep/shards/method~gd/rank~2/width~4"
SHARD_FILES = [f"{SHARDS}/shard~{i}.{ext}" for i in range(3) for ext in ("csv", "run.json")]
LINGERING = f"{SHARDS}/shard~3.csv"
FAULTS = {  # latency-wait is 5 s here
    "shard~0.csv": "slow:20",
    "shard~1.csv": "fail-once",
    "shard~3.csv": "linger-once:60",
    "ssvae-train": "epoch-floor:1.2",
}
TARGETS = [SSVAE, *(f"{SHARDS}/shard~{i}.csv" for i in range(4))]


def stop_resume_config() -> dict[str, Any]:
    """SSVAE training of EPOCHS epochs with a 1-minute limit, and four one-seed CPU shards.

    The epoch floor, not the compute, makes the epochs long: the training trains on 1,000
    digits (not 4,000) and evaluates every 20th epoch, about a third of the CPU per epoch of
    the default split evaluated every epoch (20 epochs by hand: 5.2 s against 9.2 s, 3 s of
    each starting up). It trains twice, here and on the cluster, beside the rest of the suite."""
    config = tiny_config("slurm")
    config["families"] = ["ssvae", "sweep"]
    config["ssvae"]["data"] = {"test_fraction": 0.8}
    config["ssvae"]["train"].update(epochs=EPOCHS, eval_frequency=20)
    config["ssvae"]["resources"]["ssvae_train"]["runtime"] = 1
    config["sweep"]["n_seeds"] = 4
    shard = config["sweep"]["resources"]["sweep_shard"]
    shard.update(gpu=0, runtime=5, cpus_per_task=shard.pop("cpus_per_gpu"))  # a CPU rule's key
    return config


def file_identity(path: Path) -> tuple[int, str]:
    """inode and content hash: a file deleted and written again (outputs are written to a
    temporary name and renamed), rewritten or replaced changes it. Not the mtime: Snakemake
    itself touches a job's outputs once it has registered the job as finished."""
    return path.stat().st_ino, hashlib.sha256(path.read_bytes()).hexdigest()


def watch_outputs(workdir: Path, seen: dict[str, tuple[int, str]], stop: threading.Event):
    """Record each shard output's identity when it first appears (outputs appear by rename)."""
    while not stop.wait(0.3):
        for name in SHARD_FILES:
            if name not in seen and (workdir / name).exists():
                try:
                    seen[name] = file_identity(workdir / name)
                except FileNotFoundError:
                    continue


@pytest.fixture(scope="module")
def runs(slurm_cluster, tmp_path_factory) -> dict[str, Any]:
    """The run on the cluster (requeue, time limit, failing and slow shards), and the same
    config with Snakemake's local scheduler, uninterrupted, at the same time."""
    config = stop_resume_config()
    local, cluster = (tmp_path_factory.mktemp(name) for name in ("local", "cluster"))
    env = grid_faults.install(tmp_path_factory.mktemp("faulty-bin"), FAULTS)
    seen: dict[str, tuple[int, str]] = {}
    attempts: list[str] = []
    lingering: list[str] = []
    with ThreadPoolExecutor(max_workers=1) as pool:
        uninterrupted = pool.submit(snakemake, local, config, *TARGETS)
        result, requeued = harness.run_profile(
            cluster,
            harness.REPO / "Snakefile",
            config,
            *TARGETS,
            # a loaded test machine can need more than one retry to finish the epochs
            "--retries",
            "4",
            cancel_rule="ssvae_train",
            cancel_after=STATE,
            cancel_command=("scontrol", "requeue"),
            # a requeue in the job's last seconds races SLURM's own timeout and is lost, and a
            # restart needs time to start its step again: on a loaded machine the first
            # attempt may save its first epoch too late, then a later attempt (2, 3 ...
            # minutes) is requeued
            cancel_min_left_s=20,
            cancel_left_over_used=True,
            watchers=[
                lambda stop: watch_outputs(cluster, seen, stop),
                lambda stop: harness.follow_log(cluster / LOG, attempts, stop),
                lambda stop: harness.cancel_when_running(
                    cluster, "sweep_shard_wildcards_gd_2_4_3", cluster / LINGERING, lingering, stop
                ),
            ],
            env=env,
            timeout=1500,  # a loaded test machine: up to five attempts (1 + 2 + ... + 5 minutes)
        )
        uninterrupted.result()
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-8000:]}"
    assert requeued, "the training job was never requeued"
    assert lingering, "shard 3's job was never cancelled after writing its outputs"
    jobs = harness.workdir_jobs(cluster)
    restarts = {job["id"]: harness.slurm_job(job["id"])["Restarts"] for job in jobs}
    timeline = cluster / "results/timeline"
    figure, table = str(timeline / "timeline.png"), str(timeline / "attempts.csv")
    gpuflow(
        "timeline", "--results", str(cluster / "results"), "--out", figure, "--out-table", table
    )
    return {"local": local, "cluster": cluster, "result": result, "seen": seen,
            "attempts": attempts, "jobs": jobs, "requeued": requeued[0], "restarts": restarts,
            "timeline": pd.read_csv(table, keep_default_na=False)}  # fmt: skip


def jobs_of(runs: dict[str, Any], comment_start: str) -> list[dict[str, str]]:
    return [job for job in runs["jobs"] if job["comment"].startswith(comment_start)]


def training_jobs(runs: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """The training's SLURM jobs as a failure message shows them: id, state, restarts, start
    and end, so a job that ended before its step started can be named."""
    return [
        (job["id"], job["state"], runs["restarts"][job["id"]], job["start"], job["end"])
        for job in jobs_of(runs, "rule_ssvae_train")
    ]


def comparable(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metrics.items() if k not in ("timing", "run_record")}


def test_a_training_job_was_requeued_in_place_and_the_attempts_were_retried_after_their_limit(
    runs,
):
    jobs = jobs_of(runs, "rule_ssvae_train")
    states = [job["state"] for job in jobs]
    assert len(states) >= 2 and set(states[:-1]) == {"TIMEOUT"}, states
    assert states[-1] == "COMPLETED", states
    assert runs["requeued"] in [job["id"] for job in jobs]
    assert harness.slurm_job(runs["requeued"])["Restarts"] == "1", "requeued once, same job"


def test_each_run_of_the_training_resumes_after_the_epoch_the_last_one_saved(runs):
    """Requeued run, time-limited runs, retries: every epoch runs once, in order, none lost.

    The requeued run and the last one always train; a time-limited run may not (a SLURM job can
    reach its 1-minute limit before its step starts on a loaded machine, seen in CI), so the
    log holds at least two runs' texts, each resuming where the one before stopped."""
    attempts = [text for text in runs["attempts"] if text.strip()]
    assert len(attempts) >= 2, (training_jobs(runs), [a[-300:] for a in attempts])
    epochs_run: list[int] = []
    saved = 0
    for number, text in enumerate(attempts):
        resumed = [int(e) for e in re.findall(r"resumed from \S+ after epoch (\d+)", text)]
        assert resumed == ([saved] if saved else []), text[-2000:]
        epochs = [int(e) for e in re.findall(rf"^epoch (\d+)/{EPOCHS}", text, re.M)]
        assert epochs == list(range(saved + 1, saved + 1 + len(epochs))), text[-2000:]
        epochs_run += epochs
        if number < len(attempts) - 1:
            stopped = re.findall(r"stopped by SIGTERM after epoch (\d+) of", text)
            # an attempt that trained the last epoch may still reach its limit while it ends
            # (metrics written, Snakemake's checks): the next resumes after that epoch
            if not (epochs and epochs[-1] == EPOCHS):
                assert stopped == ([str(epochs[-1])] if epochs else []), text[-2000:]
            saved = epochs[-1] if epochs else saved
    assert epochs_run == list(range(1, EPOCHS + 1)), training_jobs(runs)


def test_resumed_training_equals_the_uninterrupted_run(runs):
    cluster, local = runs["cluster"], runs["local"]
    metrics = json.loads((cluster / SSVAE).read_text())
    assert metrics["timing"]["resumed_from_epoch"] >= 1
    assert comparable(metrics) == comparable(json.loads((local / SSVAE).read_text()))
    assert not (cluster / STATE).exists(), "the state goes once the metrics are written"


def test_only_the_failed_grid_job_was_submitted_again(runs):
    per_shard = {
        shard: [job["state"] for job in jobs_of(runs, f"rule_sweep_shard_wildcards_gd_2_4_{shard}")]
        for shard in range(3)
    }
    assert per_shard == {0: ["COMPLETED"], 1: ["FAILED", "COMPLETED"], 2: ["COMPLETED"]}
    removed = removed_files(runs["result"].stderr)
    assert all(
        ("/shards/" in name and ("shard~1." in name or "shard~3." in name))
        or name.endswith("/metrics.json")
        for name in removed
    ), removed


def removed_files(stderr: str) -> list[str]:
    """The files Snakemake removed after failed jobs. Each removal is a line "Removing output
    files of failed job <rule> ...:" and a line listing them; two jobs failing at once can
    interleave the two lines of each (both headers first), and other messages can come between
    a header and its list (seen: "Will exit after finishing currently running jobs
    (scheduler)."), so lists, the lines of paths alone, are taken in order."""
    pending, removed = 0, []
    for line in stderr.splitlines():
        if line.startswith("Removing output files of failed job"):
            pending += 1
        elif pending and all(re.fullmatch(r"results/\S+", name) for name in line.split(", ")):
            removed += line.split(", ")
            pending -= 1
    return removed


def test_no_finished_output_of_another_grid_job_was_deleted_or_rewritten(runs):
    """Each output keeps the inode and content it had when it first appeared."""
    cluster, seen = runs["cluster"], runs["seen"]
    assert set(seen) == set(SHARD_FILES)
    for name in SHARD_FILES:
        assert file_identity(cluster / name) == seen[name], name


def test_a_job_ended_after_writing_its_outputs_is_retried_without_computing_again(runs):
    jobs = jobs_of(runs, "rule_sweep_shard_wildcards_gd_2_4_3")
    assert [job["state"] for job in jobs] == ["CANCELLED", "COMPLETED"]
    record = json.loads((runs["cluster"] / LINGERING).with_suffix(".run.json").read_text())
    assert record["computed"] == [] and record["resumed"] == 1, record
    kept = job_file(runs["cluster"] / f"{SHARDS}/shard~3.csv", STATE_KIND)
    assert not kept.exists(), "the run drops the kept progress once the outputs are accepted"


def test_grid_tables_equal_the_local_run_except_wall_time(runs):
    for shard in range(4):
        table = f"{SHARDS}/shard~{shard}.csv"
        on_cluster = pd.read_csv(runs["cluster"] / table).drop(columns="wall_s")
        local = pd.read_csv(runs["local"] / table).drop(columns="wall_s")
        pd.testing.assert_frame_equal(on_cluster, local)


def test_the_training_job_s_record_keeps_each_attempt_once(runs):
    """One attempt per start of the step, oldest first: each a SLURM job of the rule at one
    restart (the requeued one at restart 0 and 1), none twice, none lost of a run whose log
    shows the step at work, all stopped by SIGTERM but the last. A SLURM job that reaches its
    limit before its step starts (on a loaded machine Snakemake starts twice inside the job
    first; seen once in CI) holds no attempt: there was none."""
    record = json.loads(job_file(runs["cluster"] / SSVAE, RECORD).read_text())
    attempts = [(a["slurm_job_id"], a["restart"]) for a in record["attempts"]]
    slurm_runs = [
        (job["id"], restart)
        for job in jobs_of(runs, "rule_ssvae_train")
        for restart in range(int(runs["restarts"][job["id"]]) + 1)
    ]
    assert attempts == [run for run in slurm_runs if run in attempts], (attempts, slurm_runs)
    at_work = [t for t in runs["attempts"] if re.search(r"^(epoch \d+/|resumed from )", t, re.M)]
    assert len(attempts) >= len(at_work), (attempts, [t[-300:] for t in at_work])
    assert {(runs["requeued"], 0), (runs["requeued"], 1), slurm_runs[-1]} <= set(attempts)
    statuses = [a["status"] for a in record["attempts"]]
    # an attempt that trained the last epoch may reach its limit after its step finished
    assert statuses[-1] == "finished" and set(statuses[:-1]) <= {"stopped", "finished"}, statuses
    assert (record["started"], record["status"]) == (record["attempts"][-1]["started"], "finished")


def test_the_timeline_draws_every_attempt_of_the_requeued_job_marked(runs):
    """`gpuflow timeline` over the run's records: a bar per attempt of the training job on the
    lane of the GPU SLURM gave it; the requeued attempt is marked requeued and stopped, the
    time-limited ones stopped; the shard that failed once is marked failed; bars of CPU jobs
    on one CPU slot never overlap."""
    bars = runs["timeline"]
    record = json.loads(job_file(runs["cluster"] / SSVAE, RECORD).read_text())
    training = bars[bars["job"] == SSVAE]
    assert list(training["attempt"]) == list(range(1, len(record["attempts"]) + 1))
    for (_, bar), attempt in zip(training.iterrows(), record["attempts"], strict=True):
        [gpu] = attempt["gpus"]
        assert attempt["node"] and bar["lane"] == f"{attempt['node']} GPU {gpu['device']}"
        assert bar["start"] == pytest.approx(attempt["started"])
        requeued = (attempt["slurm_job_id"], attempt["restart"]) == (runs["requeued"], 0)
        assert bar["marks"] == ("stopped;requeued" if requeued else "stopped" if
                                attempt["status"] == "stopped" else ""), bar.to_dict()  # fmt: skip
    shard = bars[bars["job"] == f"{SHARDS}/shard~1.csv"]
    assert [m.split(";")[0] for m in shard["marks"]] == ["failed", ""]
    assert shard["lane"].str.contains(" CPU slot ").all()
    for _, lane in bars[bars["lane"].str.contains(" CPU slot ")].groupby("lane"):
        lane = lane.sort_values("start")
        assert (lane["start"].to_numpy()[1:] >= lane["end"].to_numpy()[:-1]).all()
    assert (runs["cluster"] / "results/timeline/timeline.png").stat().st_size > 10_000
