"""The submitting Snakemake killed mid-run (kill -9), then the recovery profiles/slurm/README.md
gives, on the live cluster.

The killed run's training job keeps running in SLURM (an orphan). The same command again says
the folder is locked; after `--unlock` it refuses to start while the orphan works on its target,
naming the job and the `scancel` that ends it, and submits nothing. Once the orphan is ended,
the same command resumes its saved state. SLURM's records show no two jobs of one target at
once, and the metrics equal a clean run's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from gpuflow.slurm.earlier_jobs import earlier_jobs
from tests.conftest import snakemake, tiny_config, wait_for
from tests.slurm import grid_faults, harness

pytestmark = [pytest.mark.slurm, pytest.mark.workflow]
pytest_plugins = ["tests.slurm.fixtures"]

SSVAE = "results/ssvae/frac~0.2/corrupt~0.0/alpha~10/seed~0/metrics.json"
LOG = "results/ssvae/logs/train/frac~0.2/corrupt~0.0/alpha~10.log"
STATE = "results/ssvae/jobs/frac~0.2/corrupt~0.0/alpha~10/seed~0/metrics.json.state.pt"
EPOCHS = 20  # of at least 2 s each (FAULTS): the orphan outlives the recovery steps
# On a quiet machine an epoch took 0.6 s: unfloored, the orphan finished its epochs before the
# scancel and the re-run had nothing to do. The floor keeps the local reference run's epochs few.
FAULTS = {"ssvae-train": "epoch-floor:2"}
TRAIN = "rule_ssvae_train"


def orphan_config() -> dict[str, Any]:
    config = tiny_config("slurm")
    config["families"] = ["ssvae"]
    config["ssvae"]["train"]["epochs"] = EPOCHS
    config["ssvae"]["resources"]["ssvae_train"]["runtime"] = 10
    return config


def training_jobs(workdir: Path) -> list[dict[str, str]]:
    return [job for job in harness.workdir_jobs(workdir) if job["comment"].startswith(TRAIN)]


def kill_the_submitter_mid_run(workdir: Path, command: list[str], env: dict[str, str]) -> str:
    """Start the run, kill -9 its Snakemake once the training job has saved an epoch; the id of
    that job, still running."""
    with open(workdir / "killed-run.log", "w") as out:
        submitter = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=harness.REPO
        )
        try:
            wait_for(
                lambda: (
                    (workdir / STATE).exists()
                    and any(job["state"] == "RUNNING" for job in training_jobs(workdir))
                ),
                "the training job's first saved epoch",
                timeout=300,
                interval=0.5,
            )
        finally:
            os.kill(submitter.pid, signal.SIGKILL)
            submitter.wait()
    [orphan] = [job["id"] for job in training_jobs(workdir) if job["state"] == "RUNNING"]
    return orphan


def same_command(
    command: list[str], env: dict[str, str], *extra: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*command[:1], *extra, *command[1:]],
        capture_output=True, text=True, env=env, cwd=harness.REPO, timeout=300,
    )  # fmt: skip


@pytest.fixture(scope="module")
def recovered(slurm_cluster, tmp_path_factory) -> dict[str, Any]:
    """The killed run and its documented recovery; a clean local run at the same time."""
    config = orphan_config()
    clean, workdir = tmp_path_factory.mktemp("clean"), tmp_path_factory.mktemp("orphaned")
    command = harness.profile_command(workdir, harness.REPO / "Snakefile", config, SSVAE)
    steps: dict[str, Any] = {"clean": clean, "workdir": workdir}
    env = {
        **harness.cluster_env(),
        **grid_faults.install(tmp_path_factory.mktemp("slow-bin"), FAULTS),
    }
    with ThreadPoolExecutor(max_workers=1) as pool:
        reference = pool.submit(snakemake, clean, config, SSVAE)
        steps["orphan"] = orphan = kill_the_submitter_mid_run(workdir, command, env)
        # The orphan waits (suspended) while the folder is unlocked: on a loaded machine those
        # Snakemake starts could outlast its training. It runs again before the re-run.
        subprocess.run(["scontrol", "suspend", orphan], check=True)
        steps["locked"] = same_command(command, env)
        steps["unlock"] = same_command(command, env, "--unlock")
        subprocess.run(["scontrol", "resume", orphan], check=True)
        steps["refused"] = same_command(command, env)
        steps["jobs_while_refused"] = training_jobs(workdir)
        subprocess.run(["scancel", orphan], check=True)
        # ended when the run's own check no longer lists it (not while it completes)
        wait_for(lambda: not earlier_jobs(workdir), "the orphan to end", 300, 0.5)
        # the real gpuflow: the epoch floor had only to keep the orphan alive until now
        steps["final"] = same_command(command, harness.cluster_env())
        reference.result()
    steps["jobs"] = training_jobs(workdir)
    return steps


def test_the_same_command_after_the_kill_says_the_folder_is_locked(recovered):
    assert recovered["locked"].returncode != 0
    assert "cannot be locked" in recovered["locked"].stderr + recovered["locked"].stdout
    assert recovered["unlock"].returncode == 0, recovered["unlock"].stderr[-3000:]


def test_after_unlock_the_run_refuses_naming_the_orphan_and_its_scancel(recovered):
    refused, orphan = recovered["refused"], recovered["orphan"]
    text = refused.stdout + refused.stderr
    assert refused.returncode != 0, text[-3000:]
    assert f"{orphan} ({TRAIN}_wildcards_" in text, text[-3000:]
    assert f"scancel {orphan}" in text, text[-3000:]
    assert [job["id"] for job in recovered["jobs_while_refused"]] == [orphan], "nothing submitted"


def test_once_the_orphan_is_ended_the_same_command_resumes_its_state(recovered):
    final = recovered["final"]
    assert final.returncode == 0, f"{final.stdout[-3000:]}\n{final.stderr[-6000:]}"
    log = (recovered["workdir"] / LOG).read_text()
    assert "resumed from" in log and "after epoch 0" not in log, log[-2000:]


def test_no_target_was_written_by_two_jobs_at_once(recovered):
    """SLURM's start and end times of every job of the target: one after the other."""
    jobs = recovered["jobs"]
    assert [job["state"] for job in jobs] == ["CANCELLED", "COMPLETED"], jobs
    # ISO 8601 to the second: as strings they sort in time order
    assert jobs[0]["end"] <= jobs[1]["start"], jobs


def test_the_recovered_metrics_equal_a_clean_run(recovered):
    def comparable(folder: Path) -> dict[str, Any]:
        metrics = json.loads((folder / SSVAE).read_text())
        return {k: v for k, v in metrics.items() if k not in ("timing", "run_record")}

    assert comparable(recovered["workdir"]) == comparable(recovered["clean"])
