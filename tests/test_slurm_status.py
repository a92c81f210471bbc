"""`gpuflow status --json` during and after a run on the live cluster (profiles/slurm).

The workflow of tests/slurm/status runs through the SLURM profile: `slow` (1 GPU) writes its
progress file until the test has seen it running, `broken` fails (no retries), `quick` ends at
once. While the run goes on, status lists `slow` as running with its SLURM job id (as squeue
gives it) and its progress, and `broken` as failed with its log's last error line; after the
run, everything else is done; once squeue no longer lists the ended jobs (here: no squeue at
all), status still names the failed job's SLURM id and state, from the accounting database
(sacct); and `snakemake --report` with the same profile (as the SLURM README says) makes the
report on the submit node.
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.slurm import harness
from tests.test_status import SNAKEFILE, by_rule, slow_and_broken_seen, status_json

pytestmark = [pytest.mark.slurm, pytest.mark.workflow]
pytest_plugins = ["tests.slurm.fixtures"]

PROFILES = ("--profile", str(harness.REPO / "profiles" / "slurm"))
PROFILES += ("--profile", str(harness.TEST_PROFILE))


def without_squeue(folder: Path) -> dict[str, str]:
    """The cluster environment with an `squeue` that fails, as for jobs past its MinJobAge."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "squeue").write_text("#!/bin/sh\nexit 1\n")
    (folder / "squeue").chmod(0o755)
    env = harness.cluster_env()
    env["PATH"] = f"{folder}:{env['PATH']}"
    return env


def test_status_lists_running_jobs_with_progress_and_slurm_ids_then_all_done(
    slurm_cluster, tmp_path
):
    config = {"steps": 600, "step_seconds": 1}
    args = (*PROFILES, "--configfile", str(tmp_path / "test-config.yaml"))
    outcome: dict = {}

    def run() -> None:
        outcome["result"], _ = harness.run_profile(
            tmp_path, SNAKEFILE, config, "--retries", "0", timeout=300
        )

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    try:
        seen = lambda: slow_and_broken_seen(tmp_path) or not runner.is_alive()  # noqa: E731
        wait_for(seen, "slow's progress and broken's failure", timeout=180)
        deadline = time.monotonic() + 60
        while True:
            during = status_json(tmp_path, *args, env=harness.cluster_env())
            running = [job for job in during["running"] if job["rule"] == "slow"]
            if running and running[0]["progress"] and during["failed"]:
                break
            assert runner.is_alive() and time.monotonic() < deadline, (during, outcome)
            time.sleep(2)
        [slow] = running
        queue = {job["id"]: job for job in harness.squeue("rule_slow")}
        assert slow["slurm_id"] in queue and slow["slurm_state"] == "RUNNING"
        assert queue[slow["slurm_id"]]["state"] == "RUNNING"
        assert slow["progress"]["unit"] == "steps" and slow["progress"]["total"] == 600
        assert slow["progress"]["done"] >= 1 and slow["progress"]["eta_s"] is not None
        assert during["run_active"] and during["totals"]["gpu_h_spent"] > 0
        [broken] = during["failed"]
        assert broken["rule"] == "broken" and broken["log"] == "results/logs/broken.log"
        assert broken["last_line"] == "ValueError: made to fail on purpose"
    finally:
        (tmp_path / "results").mkdir(exist_ok=True)
        (tmp_path / "results" / "release").touch()
        runner.join(timeout=240)
    result = outcome["result"]
    assert result.returncode != 0, "broken must fail the run"
    after = status_json(tmp_path, *args, env=harness.cluster_env())
    rows = by_rule(after)
    assert (rows["quick"]["done"], rows["slow"]["done"], rows["broken"]["failed"]) == (1, 1, 1)
    assert after["totals"]["done"] == 2 and after["running"] == [] and not after["run_active"]
    assert rows["slow"]["gpu_h_spent"] > 0, "1 GPU x SLURM's start to end of the job"
    [broken] = after["failed"]
    assert broken["last_line"] == "ValueError: made to fail on purpose"
    assert (broken["slurm_id"], broken["slurm_state"]) != (None, None)
    aged = status_json(tmp_path, *args, env=without_squeue(tmp_path / "bin"))
    [from_sacct] = aged["failed"]
    assert (from_sacct["slurm_id"], from_sacct["slurm_state"]) == (broken["slurm_id"], "FAILED")
    assert by_rule(aged)["slow"]["done"] == 1 and not aged["run_active"]
    where = ["--directory", str(tmp_path), "--configfile", str(tmp_path / "test-config.yaml")]
    where = ["--snakefile", str(SNAKEFILE), *where, "--report", "report.html"]
    report = subprocess.run(
        [str(harness.BIN / "snakemake"), *PROFILES, *where],
        capture_output=True,
        text=True,
        env=harness.cluster_env(),
        check=False,
    )
    assert report.returncode == 0, report.stderr[-3000:]
    assert (tmp_path / "report.html").stat().st_size > 10_000
