"""A shard job survives being killed, losing workers and failing seeds, and its numbers never
depend on how many workers ran it.

Every test runs the real `gpuflow sweep-shard` process; faults are real (SIGKILL of the job, a
worker that SIGKILLs itself, a seed that raises: injected by tests/sweep_faults.py, which wraps
the seed function of the real step; the package has no fault hooks).
"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from gpuflow.cli import build_parser
from gpuflow.job.context import Job
from gpuflow.job.paths import STATE, job_file
from gpuflow.settings.blocks import family_settings
from gpuflow.sweep.shard import state_key
from tests import sweep_faults
from tests.conftest import BIN, REPO, alive, wait_for, wait_while_running, workflow_env

# Guess-and-check that can never reach its threshold: every seed does the same, fixed work.
SETTINGS = {
    "data": {"seed": 0, "input_dim": 8, "output_dim": 8, "n_train": 4, "label_noise": 0.0},
    "gnc": {"loss_threshold": 1e-9, "max_guesses": 80000, "batch_size": 4096},
}
SEEDS = "0:6"


def shard_command(out: Path, workers: int, seeds: str = SEEDS) -> list[str]:
    return [
        str(BIN / "gpuflow"),
        "sweep-shard",
        "--method",
        "gnc",
        "--teacher-rank",
        "2",
        "--student-width",
        "4",
        "--seeds",
        seeds,
        "--settings",
        json.dumps(SETTINGS),
        "--runtime",
        json.dumps({"device": "cpu", "cpu_workers": workers}),
        "--out",
        str(out),
        "--run-out",
        str(out.with_suffix(".run.json")),
    ]


def run_shard(
    out: Path, workers: int, seeds: str = SEEDS, faults: str = ""
) -> subprocess.CompletedProcess[str]:
    """The shard step; with `faults`, through tests/sweep_faults.py (see there)."""
    command = shard_command(out, workers, seeds)
    if faults:
        command = [str(BIN / "python"), "-m", "tests.sweep_faults", faults, "--", *command[2:]]
    return subprocess.run(
        command, capture_output=True, text=True, env=workflow_env(), timeout=300, cwd=REPO
    )


def table(path: Path) -> list[dict[str, str]]:
    """The shard's rows without the wall time (the one column that is measured, not computed)."""
    with open(path, newline="") as handle:
        return [{k: v for k, v in row.items() if k != "wall_s"} for row in csv.DictReader(handle)]


def kept(out: Path) -> dict[str, dict]:
    """The rows and errors of the seeds the shard's resume state holds, by seed."""
    path = job_file(out, STATE)
    if not path.exists():
        return {"rows": {}, "failed": {}}
    return torch.load(path, weights_only=True)["data"]


def computed_seeds(log: str) -> list[int]:
    match = re.search(r"computing \d+: \[([\d, ]*)\]", log)
    assert match, log
    return [int(s) for s in match.group(1).split(",") if s.strip()]


def worker_pids(log: str) -> list[int]:
    return [int(pid) for pid in re.findall(r"worker \d+ ready \(pid (\d+)", log)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list[dict[str, str]]:
    """The shard run once, uninterrupted, with two workers."""
    out = tmp_path_factory.mktemp("reference") / "shard~0.csv"
    result = run_shard(out, workers=2)
    assert result.returncode == 0, result.stderr
    rows = table(out)
    assert [int(r["seed"]) for r in rows] == list(range(6))
    return rows


def test_one_and_two_workers_give_identical_per_seed_results(tmp_path, reference):
    out = tmp_path / "shard~0.csv"
    result = run_shard(out, workers=1)
    assert result.returncode == 0, result.stderr
    assert table(out) == reference


def test_a_shard_killed_midway_reruns_only_the_missing_seeds_and_ends_identical(
    tmp_path, reference
):
    out = tmp_path / "shard~0.csv"
    log_path = tmp_path / "job.log"
    # every seed of the killed attempt lasts a second, so the kill lands midway however busy
    # the machine (its seeds take milliseconds); the numbers are the same
    command = [str(BIN / "python"), "-m", "tests.sweep_faults", "", "--"]
    with open(log_path, "w") as log:
        job = subprocess.Popen(
            [*command, *shard_command(out, workers=2)[2:]],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**workflow_env(), sweep_faults.SEED_FLOOR_ENV: "1"},
            cwd=REPO,
            start_new_session=True,
        )
    try:
        two_seeds = lambda: len(kept(out)["rows"]) >= 2  # noqa: E731
        wait_while_running(two_seeds, job, "two seeds done", 120, 0.02, log=log_path)
        assert job.poll() is None, log_path.read_text()
        job.send_signal(signal.SIGKILL)
        job.wait()
        done_before = set(kept(out)["rows"])
        assert 2 <= len(done_before) < 6, "the kill must land midway"
        assert not out.exists(), "no table before every seed is done"
        for pid in worker_pids(log_path.read_text()):  # workers die with their job
            wait_for(lambda pid=pid: not alive(pid), f"worker {pid} to die with its job", 5, 0.05)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)

    rerun = run_shard(out, workers=2)
    assert rerun.returncode == 0, rerun.stderr
    assert computed_seeds(rerun.stderr) == sorted(set(range(6)) - done_before)
    assert table(out) == reference
    assert not job_file(out, STATE).exists(), "the table holds it all now"


def test_seeds_finished_on_another_device_type_are_computed_again(tmp_path):
    """Guesses and student weights are drawn on the device, and CPU and CUDA generators differ:
    a seed a shard finished on a GPU is not taken into its CPU run; one finished on the CPU is."""
    out = tmp_path / "shard~0.csv"
    command = shard_command(out, workers=1, seeds="0:2")
    args = build_parser().parse_args(command[1:])
    sweep = family_settings("sweep", args.settings, args.runtime)
    for device_type, computed in (("cuda", [0, 1]), ("cpu", [1])):
        job = Job("-", [out, out.with_suffix(".run.json")])
        job.state(**state_key(args, sweep, device_type)).save({"rows": {0: {"seed": 0}}})
        result = run_shard(out, workers=1, seeds="0:2")
        assert result.returncode == 0, result.stderr
        assert computed_seeds(result.stderr) == computed, device_type


def test_a_worker_that_dies_hands_its_seeds_to_the_survivor_and_the_shard_completes(
    tmp_path, reference
):
    out = tmp_path / "shard~0.csv"
    result = run_shard(out, workers=2, faults="kill:0:2")  # worker 0 is dealt seeds 0, 2, 4
    assert result.returncode == 0, result.stderr
    assert re.search(
        r"worker 0 \(pid \d+, cpu\) died with exit code -9 while running seed 2", result.stderr
    ), result.stderr
    assert table(out) == reference
    record = json.loads(out.with_suffix(".run.json").read_text())
    assert len(record["worker_deaths"]) == 1


def test_a_failing_seed_is_recorded_does_not_stop_the_others_and_fails_the_shard(
    tmp_path, reference
):
    out = tmp_path / "shard~0.csv"
    result = run_shard(out, workers=2, faults="raise:*:3")
    assert result.returncode == 2
    assert "1 of 6 seed(s) failed: [3]" in result.stderr
    assert "injected fault at seed 3" in result.stderr
    assert not out.exists()
    state = kept(out)
    assert list(state["failed"]) == [3] and "injected fault" in state["failed"][3]
    assert sorted(state["rows"]) == [0, 1, 2, 4, 5]

    retry = run_shard(out, workers=2)
    assert retry.returncode == 0, retry.stderr
    assert computed_seeds(retry.stderr) == [3]
    assert table(out) == reference


def test_a_seed_that_kills_every_worker_is_failed_after_two_deaths(tmp_path, reference):
    out = tmp_path / "shard~0.csv"
    result = run_shard(out, workers=1, seeds="0:3", faults="kill:*:1")
    assert result.returncode == 2, result.stderr
    assert "started replacement worker 1 on cpu" in result.stderr
    assert "1 of 3 seed(s) failed: [1]" in result.stderr
    assert "2 workers died running this seed" in result.stderr
    assert sorted(kept(out)["rows"]) == [0, 2]
