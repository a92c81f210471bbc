"""SLURM faults users meet, on the live cluster through the production profile (sacct status,
requeue on), in one run that meets them one after another, one job at a time: it finishes
without a second command, equal to an undisturbed local run, and no job runs twice at once.

- The controller is down as the run starts, until 25 s after its first sbatch failed "Unable to
  contact slurm controller" (past the 20 s in which the SLURM plugin alone gives up), and again
  for 15 s once the training has saved an epoch (status queries fail): the executor waits both
  out.
- Then the training node's slurmd stops, past SlurmdTimeout: SLURM ends the job NODE_FAIL and
  requeues it; once slurmd is back it starts again and resumes from its saved epoch, and the
  shard submitted after it is submitted without a broken exclude list.

A second, shorter run meets an outage longer than the site's wait (controller_outage_minutes):
the run stops in one line, using up no job's retry, and the same command then finishes it.

A job cancelled by hand (`CANCELLED by <uid>` in sacct) is tests/test_slurm_cluster.py's and
tests/test_slurm_stop_resume.py's.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from gpuflow.job.paths import STATE, job_file
from tests.conftest import snakemake, tiny_config, wait_for
from tests.slurm import cluster, grid_faults, harness

pytestmark = [pytest.mark.slurm, pytest.mark.workflow]
pytest_plugins = ["tests.slurm.fixtures"]
# it stops the cluster's daemons: no other module may use the cluster meanwhile
CLUSTER_ALONE = True

SSVAE = "results/ssvae/frac~0.2/corrupt~0.0/alpha~10/seed~0/metrics.json"
LOG = "results/ssvae/logs/train/frac~0.2/corrupt~0.0/alpha~10.log"
SHARD = "results/sweep/shards/method~gd/rank~2/width~4/shard~0.csv"
# down as the run starts, until this long after its first sbatch failed (the executor's pauses
# have grown to 8 s by then)
CONTROLLER_DOWN_S = 25
NO_ANSWER = "SLURM does not answer (sbatch: Unable to contact slurm controller)"
STATUS_OUTAGE_S = 15  # while the training runs
OUTAGE_MINUTES = 0.1  # the wait of the run that meets a longer outage (6 s)
# of at least 1.2 s each: the first attempt trains on through the second outage and until the
# node fails (SlurmdTimeout 30 s: it reached epoch 32-36 after a 20 s outage), so that the
# requeued one has epochs left
EPOCHS = 45


def faults_config() -> dict[str, Any]:
    """One SSVAE training of EPOCHS epochs on 1,000 digits and one CPU sweep shard."""
    config = tiny_config("slurm")
    config["families"] = ["ssvae", "sweep"]
    config["ssvae"]["data"] = {"test_fraction": 0.8}
    config["ssvae"]["train"].update(epochs=EPOCHS, eval_frequency=20)
    config["sweep"]["n_seeds"] = 1
    shard = config["sweep"]["resources"]["sweep_shard"]
    shard.update(gpu=0, runtime=5, cpus_per_task=shard.pop("cpus_per_gpu"))  # a CPU rule's key
    return config


def accounting(name: str) -> list[dict[str, str]]:
    """sacct's records of the run's jobs, every attempt of a requeued one too (-D)."""
    fields = "JobIDRaw,State,Comment,Start,End"
    rows = harness.sacct_jobs(name, fields)  # -X: allocations
    return [dict(zip(fields.split(","), row, strict=True)) for row in rows]


def run_beside_local(cluster_dir: Path, local_dir: Path, config, *args: str, **kwargs):
    """The run on the cluster and, at the same time, the same config run locally, undisturbed."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        undisturbed = pool.submit(snakemake, local_dir, config, SSVAE, SHARD)
        result, _ = harness.run_profile(
            cluster_dir, harness.REPO / "Snakefile", config, SSVAE, SHARD, *args, **kwargs
        )
        undisturbed.result()
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-8000:]}"
    return result


@pytest.fixture(scope="module")
def faults(slurm_cluster, tmp_path_factory) -> dict[str, Any]:
    """The run, meeting the faults in turn: the controller down as it starts, down again once
    the training has saved an epoch, then the training node's slurmd stopped until SLURM has
    ended the job NODE_FAIL. One job at a time, the training first: the shard is submitted
    after the node failure. Which attempts of the training ran, sampled every 0.3 s."""
    local, workdir = (tmp_path_factory.mktemp(name) for name in ("faults-local", "faults-cluster"))
    env = grid_faults.install(
        tmp_path_factory.mktemp("faults-bin"), {"ssvae-train": "epoch-floor:1.2"}
    )
    down: list[tuple[float, float]] = []
    failed: list[str] = []
    running: list[set[str]] = []

    def controller_down(
        seconds: float, stop: threading.Event, counted_from: Callable[[], bool] | None = None
    ) -> None:
        """slurmctld stopped, then started `seconds` after `counted_from()` first holds (at most
        two minutes after the stop)."""
        cluster.stop_daemon("slurmctld")
        down.append((time.monotonic(), 0.0))
        give_up = time.monotonic() + 120
        while counted_from and not counted_from() and time.monotonic() < give_up:
            if stop.wait(0.5):
                break
        stop.wait(seconds)
        cluster.start_daemon("slurmctld")
        down[-1] = (down[-1][0], time.monotonic())

    def sbatch_failed() -> bool:
        logs = (workdir / ".snakemake" / "log").glob("*.snakemake.log")
        return any(NO_ANSWER in log.read_text(errors="replace") for log in logs)

    def faults_in_turn(stop: threading.Event) -> None:
        controller_down(CONTROLLER_DOWN_S, stop, counted_from=sbatch_failed)
        state = job_file(workdir / SSVAE, STATE)
        while not stop.wait(0.5) and not state.exists():
            continue
        if stop.is_set():
            return
        controller_down(STATUS_OUTAGE_S, stop)
        cluster.stop_daemon("slurmd")
        try:
            failure = lambda: node_failed(workdir, failed)  # noqa: E731
            wait_for(failure, "NODE_FAIL", timeout=4 * cluster.SLURMD_TIMEOUT)
        finally:
            cluster.start_daemon("slurmd")

    def attempts_running(stop: threading.Event) -> None:
        while not stop.wait(0.3):
            running.append(training_attempts())

    try:
        result = run_beside_local(
            workdir, local, faults_config(), "--jobs", "1", "--prioritize", SSVAE,
            watchers=[faults_in_turn, attempts_running], env=env, timeout=900,
        )  # fmt: skip
    finally:
        if not harness.controller_answers():
            cluster.start_daemon("slurmctld")
    return {"result": result, "local": local, "cluster": workdir, "down": down,
            "failed": failed, "running": running}  # fmt: skip


def node_failed(workdir: Path, failed: list[str]) -> bool:
    """Whether SLURM has ended the run's training job NODE_FAIL (its id into `failed`)."""
    for job in harness.workdir_jobs(workdir):
        if job["comment"].startswith("rule_ssvae_train"):
            states = harness.sacct_jobs_of(job["id"], "State")
            if any(row[0].startswith("NODE_FAIL") for row in states):
                failed.append(job["id"])
                return True
    return False


def training_attempts() -> set[int]:
    """The running attempts of the training on the cluster, by the pid of the Python process
    each runs its `gpuflow ssvae-train` in (the undisturbed run's carries no SLURM job)."""
    attempts = set()
    for pid in harness.processes_with("GPUFLOW_GPUS=1"):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        python = Path(argv[0].decode()).name.startswith("python")
        in_job = any(entry.startswith(b"SLURM_JOB_ID=") for entry in environ)
        if python and in_job and b"ssvae-train" in argv:
            attempts.add(pid)
    return attempts


def test_a_run_started_while_the_controller_is_down_waits_it_out(faults):
    stderr = faults["result"].stderr
    assert NO_ANSWER in stderr, stderr[-3000:]
    assert "SLURM answers again" in stderr
    assert [end > start for start, end in faults["down"]] == [True, True], "down twice, back twice"


def test_a_job_of_a_failed_node_is_requeued_resumes_and_completes(faults):
    [job_id] = faults["failed"][:1]
    states = [row[0] for row in harness.sacct_jobs_of(job_id, "State")]
    assert states[0].startswith("NODE_FAIL") and states[-1] == "COMPLETED", states
    log = (faults["cluster"] / LOG).read_text()
    assert re.search(r"resumed from \S+ after epoch \d+", log), log[-2000:]


def test_each_job_was_submitted_once_and_no_attempt_ran_beside_another(faults):
    """The training is one SLURM job (requeued in place), the shard one more; the training's
    two attempts (before and after the node failure) never ran at once."""
    jobs = accounting(harness.run_id(faults["result"].stderr))
    rules = sorted(job["Comment"].split("_wildcards_")[0] for job in jobs)
    assert rules == ["rule_ssvae_train", "rule_sweep_shard"]
    assert {job["State"] for job in jobs} == {"COMPLETED"}
    assert len(set().union(*faults["running"])) == 2, "the attempts before and after"
    assert max(len(attempts) for attempts in faults["running"]) == 1


def test_later_submissions_after_a_node_failure_have_no_broken_exclude_list(faults):
    """Whether a status check sees the NODE_FAIL depends on when it falls: sacct shows the
    requeued job's new record (PENDING) from the moment SLURM requeues it. Where one did, the
    failed node (the only one of the shard's partition) is not excluded; either way the shard,
    submitted after the failure, ran (the exclusion itself: tests/test_gpuflow_executor.py)."""
    stderr = faults["result"].stderr
    assert "Unable to open file" not in stderr and "--exclude=None" not in stderr


@pytest.fixture(scope="module")
def outage_past_the_wait(slurm_cluster, tmp_path_factory) -> dict[str, Any]:
    """The shard alone, with the profile's retries, while the controller is down for longer
    than the site's wait (OUTAGE_MINUTES); once it is back, the same command again."""
    workdir = tmp_path_factory.mktemp("outage-cluster")
    site = yaml.safe_load(harness.TEST_SITE.read_text())
    site["controller_outage_minutes"] = OUTAGE_MINUTES
    site_file = tmp_path_factory.mktemp("outage-site") / "site.yaml"
    site_file.write_text(yaml.safe_dump(site))
    env = {"GPUFLOW_SLURM_SITE": str(site_file)}
    run = lambda: harness.run_profile(  # noqa: E731
        workdir, harness.REPO / "Snakefile", faults_config(), SHARD, env=env, timeout=300
    )[0]
    cluster.stop_daemon("slurmctld")
    try:
        stopped = run()
    finally:
        cluster.start_daemon("slurmctld")
    return {"stopped": stopped, "resumed": run(), "cluster": workdir}


def test_an_outage_past_the_wait_stops_the_run_using_up_no_retry(outage_past_the_wait):
    """The run stops with the outage's one line and exit 1: the job is not counted as failed
    (no restart, which would come back with twice its memory and time). The same command,
    once the controller answers, submits it once, with the memory and time of attempt 1."""
    stopped, resumed = outage_past_the_wait["stopped"], outage_past_the_wait["resumed"]
    assert stopped.returncode == 1, stopped.stderr[-3000:]
    assert "WorkflowError:\nSLURM did not answer for " in stopped.stderr, stopped.stderr[-3000:]
    assert "Trying to restart job" not in stopped.stderr, stopped.stderr[-3000:]
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (outage_past_the_wait["cluster"] / SHARD).exists()
    jobs = harness.sacct_jobs(harness.run_id(resumed.stderr), "ReqMem,Timelimit")
    shard = faults_config()["sweep"]["resources"]["sweep_shard"]
    assert jobs == [[f"{shard['mem_mb']}M", f"00:{shard['runtime']:02d}:00"]]


def comparable(path: Path) -> dict[str, Any]:
    metrics = json.loads(path.read_text())
    return {k: v for k, v in metrics.items() if k not in ("timing", "run_record")}


def test_the_run_equals_the_undisturbed_run(faults):
    cluster_dir, local_dir = faults["cluster"], faults["local"]
    assert comparable(cluster_dir / SSVAE) == comparable(local_dir / SSVAE)
    on_cluster = pd.read_csv(cluster_dir / SHARD).drop(columns="wall_s")
    pd.testing.assert_frame_equal(on_cluster, pd.read_csv(local_dir / SHARD).drop(columns="wall_s"))
