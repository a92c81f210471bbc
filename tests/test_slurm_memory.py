"""A training job that outgrows its memory, on the live cluster, as on a production one.

The test cluster holds each job to the memory it asked for (cgroup v1, ConstrainRAMSpace). An
SSVAE training job of the real workflow asks for MEM_MB; from epoch BALLAST_EPOCH on its step
holds BALLAST_MB more (tests/slurm/grid_faults.py: the numbers do not change), more than its
first attempt has and less than the profile's retry gives (mem_mb * attempt, capped at the
largest max_mem_mb of the site's GPU partitions: RETRY_MEM_MB here, less than twice MEM_MB). So
the first attempt saves BALLAST_EPOCH epochs and is killed by the cgroup: its step ends
OUT_OF_MEMORY and the job FAILED. Snakemake (status from sacct, as in production) retries it
with more memory, all the GPU partition has: twice as much would fit no partition of the site
file, and the SLURM plugin would send the retry to the cluster's default partition (on a real
cluster often one without GPUs; here the one node serves both partitions). The retry resumes
after the saved epoch and ends with the metrics of an undisturbed local run. Meanwhile `gpuflow
status` shows the first attempt as failed, OUT_OF_MEMORY (from sacct's steps), with its SLURM
job id; the test holds Snakemake until status has shown it, so that the retry cannot come
before the first read.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import snakemake, tiny_config
from tests.slurm import grid_faults, harness

pytestmark = [pytest.mark.slurm, pytest.mark.workflow]
pytest_plugins = ["tests.slurm.fixtures"]

SSVAE = "results/ssvae/frac~0.2/corrupt~0.0/alpha~10/seed~0/metrics.json"
LOG = "results/ssvae/logs/train/frac~0.2/corrupt~0.0/alpha~10.log"
EPOCHS = 6
BALLAST_EPOCH = 2
MEM_MB = 1200  # the job's whole cgroup: in-job Snakemake and the training, about 600 MB here
BALLAST_MB = 1000  # 600 + 1000 > 1200, < 2000
RETRY_MEM_MB = 2000  # the GPU partition's max_mem_mb in this test's site file
FAULTS = {"ssvae-train": f"ballast-from-epoch:{BALLAST_EPOCH}:{BALLAST_MB}"}
# Snakemake sees a job end up to this long after SLURM ended it
STATUS_CHECK_S = 20
HOLD_S = 120  # the longest Snakemake is held for status to show the failed attempt


def memory_config() -> dict[str, Any]:
    """SSVAE alone, EPOCHS epochs, MEM_MB for its training job, one retry."""
    config = tiny_config("slurm")
    config["families"] = ["ssvae"]
    config["ssvae"]["train"]["epochs"] = EPOCHS
    config["ssvae"]["resources"]["ssvae_train"]["mem_mb"] = MEM_MB
    return config


def read_status(cluster) -> dict[str, list[dict[str, Any]]] | None:
    """`gpuflow status --json` of the run, as a user types it (None while it cannot answer)."""
    command = [str(harness.BIN / "gpuflow"), "status", "--json", "--directory", str(cluster)]
    command += ["--profile", str(harness.REPO / "profiles" / "slurm")]
    command += ["--profile", str(harness.TEST_PROFILE)]
    command += ["--configfile", str(cluster / "test-config.yaml")]
    result = subprocess.run(
        command, capture_output=True, text=True, env=harness.cluster_env(), check=False
    )
    return json.loads(result.stdout) if result.returncode == 0 else None


def read_training_entries(cluster) -> list[dict[str, Any]]:
    """The ssvae_train entries of one status read, running or failed, each with its kind
    (none while status cannot answer)."""
    status = read_status(cluster)
    if status is None:
        return []
    return [
        {**job, "kind": kind}
        for kind in ("running", "failed")
        for job in status[kind]
        if job["rule"] == "ssvae_train"
    ]


def run_snakemake() -> int | None:
    """The pid of the run's Snakemake: this process's child started with --profile."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and b"--profile" in cmdline:
            return int(stat.parent.name)
    return None


def watch_status(cluster, seen: list[dict[str, Any]], stop: threading.Event) -> None:
    """Collect every status entry of ssvae_train into `seen`, reading status every second.

    The run's Snakemake is held (SIGSTOP) from the start of the first training job until
    status has shown that job out of memory, or HOLD_S have passed (SLURM's accounting may
    record the step a moment after the job): Snakemake submits the retry at its
    first status check after the failure, which may come before status is read once. The
    SLURM job runs on meanwhile; only the retry waits, as it does for up to STATUS_CHECK_S.
    """
    pid = None
    while pid is None and not stop.wait(0.2):
        running = [j for j in harness.workdir_jobs(cluster) if j["state"] == "RUNNING"]
        if any(j["comment"].startswith("rule_ssvae_train") for j in running):
            pid = run_snakemake()
    if pid is None:
        return
    os.kill(pid, signal.SIGSTOP)
    held_until = time.monotonic() + HOLD_S
    try:
        while time.monotonic() < held_until and not stop.wait(1):
            seen += read_training_entries(cluster)
            if any((j["kind"], j["slurm_state"]) == ("failed", "OUT_OF_MEMORY") for j in seen):
                break
    finally:
        os.kill(pid, signal.SIGCONT)
    while not stop.wait(1):
        seen += read_training_entries(cluster)


def sacct_attempts(name: str) -> list[tuple[str, str, str]]:
    """sacct -X of the run's training jobs: (id, state, requested memory), oldest first."""
    rows = harness.sacct_jobs(name, "JobIDRaw,Comment,State,ReqMem")
    return [
        (i, state, mem) for i, comment, state, mem in rows if comment.startswith("rule_ssvae_t")
    ]


def step_states(job_id: str) -> dict[str, str]:
    """sacct's state of each step of a job (<id>.batch, <id>.0, ...)."""
    command = ["sacct", "--noheader", "--parsable2", f"--jobs={job_id}", "--format=JobID,State"]
    listed = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return dict(line.split("|") for line in listed.splitlines())


@pytest.fixture(scope="module")
def run(slurm_cluster, tmp_path_factory) -> dict[str, Any]:
    """The training through the SLURM profile (one retry), and undisturbed locally meanwhile."""
    config = memory_config()
    local, cluster = (tmp_path_factory.mktemp(name) for name in ("local", "cluster"))
    env = grid_faults.install(tmp_path_factory.mktemp("faulty-bin"), FAULTS)
    site = yaml.safe_load(harness.TEST_SITE.read_text())
    site["partitions"]["gpu"]["max_mem_mb"] = RETRY_MEM_MB
    site_file = tmp_path_factory.mktemp("site") / "site.yaml"
    site_file.write_text(yaml.safe_dump(site))
    env["GPUFLOW_SLURM_SITE"] = str(site_file)
    attempts: list[str] = []
    seen: list[dict[str, Any]] = []
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=1) as pool:
        undisturbed = pool.submit(snakemake, local, config, SSVAE)
        result, _ = harness.run_profile(
            cluster,
            harness.REPO / "Snakefile",
            config,
            SSVAE,
            "--retries",
            "1",
            "--seconds-between-status-checks",
            str(STATUS_CHECK_S),
            watchers=[
                lambda stop: harness.follow_log(cluster / LOG, attempts, stop),
                lambda stop: watch_status(cluster, seen, stop),
            ],
            env=env,
            timeout=900,
        )
        undisturbed.result()
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-8000:]}"
    return {"local": local, "cluster": cluster, "result": result, "seen": seen,
            "attempts": [a for a in attempts if a.strip()],
            "jobs": sacct_attempts(harness.run_id(result.stderr)),
            "seconds": time.monotonic() - started}  # fmt: skip


def test_the_first_attempt_was_killed_out_of_memory_and_the_retry_had_all_its_partition_has(
    run,
):
    """The training runs in the job's step 0 (the jobstep plugin's srun): that step ends
    OUT_OF_MEMORY; the batch step, the in-job Snakemake, then fails, and so does the job."""
    assert run["jobs"] == [
        (run["jobs"][0][0], "FAILED", f"{MEM_MB}M"),
        (run["jobs"][1][0], "COMPLETED", f"{RETRY_MEM_MB}M"),
    ], run["jobs"]
    assert step_states(run["jobs"][0][0])[f"{run['jobs'][0][0]}.0"] == "OUT_OF_MEMORY"


def test_the_retry_resumed_after_the_epochs_the_first_attempt_saved(run):
    first, retry = run["attempts"]
    epochs = [int(e) for e in re.findall(rf"^epoch (\d+)/{EPOCHS}", first, re.M)]
    assert epochs == list(range(1, BALLAST_EPOCH + 1)), first[-2000:]
    assert re.findall(r"resumed from \S+ after epoch (\d+)", retry) == [str(BALLAST_EPOCH)]
    epochs = [int(e) for e in re.findall(rf"^epoch (\d+)/{EPOCHS}", retry, re.M)]
    assert epochs == list(range(BALLAST_EPOCH + 1, EPOCHS + 1)), retry[-2000:]


def test_resumed_training_equals_the_undisturbed_run(run):
    cluster, local = run["cluster"], run["local"]
    metrics = json.loads((cluster / SSVAE).read_text())
    assert metrics["timing"]["resumed_from_epoch"] == BALLAST_EPOCH
    drop = ("timing", "run_record")
    expected = json.loads((local / SSVAE).read_text())
    assert {k: v for k, v in metrics.items() if k not in drop} == {
        k: v for k, v in expected.items() if k not in drop
    }


def test_status_showed_the_first_attempt_out_of_memory_until_the_retry_ran(run):
    first, retry = (job_id for job_id, _, _ in run["jobs"])
    states = [(job["kind"], job["slurm_id"], job["slurm_state"]) for job in run["seen"]]
    oom = ("failed", first, "OUT_OF_MEMORY")
    assert oom in states, states
    assert ("running", retry, "RUNNING") in states, states
    assert states.index(oom) < states.index(("running", retry, "RUNNING"))
