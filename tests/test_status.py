"""`gpuflow status`: jobs counted from a real local Snakemake run, progress and ETA from files.

The small workflow of tests/slurm/status (a slow job writing its progress file, a job that fails,
a quick one) runs with the real Snakemake while `gpuflow status --json` looks at it; the same
Snakefile runs on the live cluster in tests/test_slurm_status.py. The readers of each family's
progress are checked on files written the way its step writes them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from gpuflow.job.paths import RECORD, job_file
from gpuflow.job.progress import ProgressWriter, progress_path, write_progress
from gpuflow.plan import Job
from gpuflow.status.collect import Seen, classify, telemetry_gpu_hours
from gpuflow.status.progress import Progress, job_progress
from gpuflow.status.snakemake_files import failed_jobs, incomplete_markers
from tests.conftest import BIN, REPO, workflow_env

SNAKEFILE = REPO / "tests" / "slurm" / "status" / "Snakefile"


def status_json(workdir: Path, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """`gpuflow status --json` of the status workflow in `workdir`."""
    command = [str(BIN / "gpuflow"), "status", "--json", "--snakefile", str(SNAKEFILE)]
    result = subprocess.run(
        [*command, "--directory", str(workdir), *args],
        capture_output=True,
        text=True,
        env=env or workflow_env(),
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def by_rule(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["rule"]: row for row in status["rules"]}


def test_status_during_and_after_a_local_run(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("steps: 600\nstep_seconds: 1\n", encoding="utf-8")
    command = [str(BIN / "snakemake"), "--snakefile", str(SNAKEFILE), "--directory", str(tmp_path)]
    command += ["--configfile", str(config), "--cores", "2", "--keep-going"]
    args = ("--configfile", str(config))
    before = by_rule(status_json(tmp_path, *args))
    assert {rule: row["todo"] for rule, row in before.items()} == dict.fromkeys(
        ("quick", "slow", "broken"), 1
    )
    run = subprocess.Popen(command, env=workflow_env(), stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            during = status_json(tmp_path, *args)
            running = [job for job in during["running"] if job["rule"] == "slow"]
            if running and running[0]["progress"] and during["failed"]:
                break
            assert run.poll() is None and time.monotonic() < deadline, during
            time.sleep(1)
        assert during["run_active"]
        assert by_rule(during)["slow"]["running"] == 1
        progress = running[0]["progress"]
        assert progress["unit"] == "steps" and progress["total"] == 600
        assert 1 <= progress["done"] < 600 and progress["eta_s"] is not None
        assert 0 < progress["eta_s"] <= 600 * 3
        assert running[0]["slurm_id"] is None
        [failed] = during["failed"]
        assert failed["rule"] == "broken" and failed["log"] == "results/logs/broken.log"
        assert failed["last_line"] == "ValueError: made to fail on purpose"
    finally:
        (tmp_path / "results" / "release").touch()
        run.wait(timeout=120)
    after = status_json(tmp_path, *args)
    rows = by_rule(after)
    assert (rows["quick"]["done"], rows["slow"]["done"], rows["broken"]["failed"]) == (1, 1, 1)
    assert after["totals"]["running"] == after["totals"]["queued"] == 0
    assert rows["slow"]["gpu_h_spent"] > 0, "1 GPU x Snakemake's recorded start to end"
    assert not after["run_active"] and after["running"] == []
    assert after["failed"][0]["last_line"] == "ValueError: made to fail on purpose"
    # a later `snakemake --unlock` writes a log of its own: the failure is still the latest run's
    unlock = [*command[:7], "--unlock"]
    subprocess.run(unlock, env=workflow_env(), check=True, capture_output=True)
    assert [job["rule"] for job in status_json(tmp_path, *args)["failed"]] == ["broken"]


def test_a_job_killed_with_its_run_is_left_incomplete(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("steps: 60\nstep_seconds: 1\n", encoding="utf-8")
    command = [str(BIN / "snakemake"), "--snakefile", str(SNAKEFILE), "--directory", str(tmp_path)]
    command += ["--configfile", str(config), "--cores", "1", "results/out/slow.txt"]
    run = subprocess.Popen(command, env=workflow_env(), start_new_session=True)
    progress = progress_path(tmp_path / "results" / "out" / "slow.txt")
    deadline = time.monotonic() + 60
    while not progress.exists():
        assert run.poll() is None and time.monotonic() < deadline
        time.sleep(0.5)
    os.killpg(run.pid, signal.SIGKILL)
    run.wait(timeout=30)
    assert set(incomplete_markers(tmp_path)) == {"results/out/slow.txt"}
    status = status_json(tmp_path, "results/out/slow.txt", "--configfile", str(config))
    assert by_rule(status)["slow"]["incomplete"] == 1
    assert [job["output"] for job in status["incomplete"]] == [["results/out/slow.txt"]]
    # While a later run is active, the killed run's marker stays a leftover; a marker the
    # active run wrote (it started the job) is a running job.
    slow = Job(rule="slow", local=False, output=["results/out/slow.txt"])
    markers = incomplete_markers(tmp_path)
    started = markers["results/out/slow.txt"].started

    def state(run_started: float) -> str:
        seen = Seen(tmp_path, markers, {}, [], run_active=True, run_started=run_started)
        return classify(slow, seen).state

    assert (state(started + 60), state(started - 60)) == ("incomplete", "running")


# --- progress and ETA, read from files written as each step writes them -----------------------


def test_the_eta_is_the_rate_so_far_applied_to_what_is_left():
    progress = Progress(done=2, total=8, unit="seeds", started=100.0, updated=110.0, source="x")
    assert progress.eta_s(now=110.0) == pytest.approx(30.0)
    assert progress.eta_s(now=115.0) == pytest.approx(25.0)
    assert progress.eta_s(now=1000.0) == 0.0
    assert Progress(0, 8, "seeds", 100.0, 110.0, "x").eta_s(now=110.0) is None
    resumed = Progress(done=6, total=8, unit="seeds", started=100, updated=110, source="x")
    resumed.resumed_at = 4
    assert resumed.eta_s(now=110.0) == pytest.approx(10.0)


def job(rule: str, output: str, log: str, **wildcards: str) -> Job:
    return Job(rule=rule, local=False, wildcards=wildcards, output=[output], log=[log])


@pytest.mark.parametrize(
    ("rule", "output", "unit"),
    [
        ("fluency_perplexity", "results/fluency/perplexity/shard~0.csv", "tokens"),
        ("fluency_toxicity", "results/fluency/toxicity/shard~0.csv", "texts"),
        ("sweep_shard", "results/sweep/shards/method~gd/rank~2/width~4/shard~0.csv", "seeds"),
        ("ssvae_train", "results/ssvae/frac~0.1/corrupt~0.0/alpha~1/seed~0/metrics.json", "epochs"),
        ("scaling_train", "results/scaling/runs/short/nodes~1/world~2/run.json", "epochs"),
    ],
)
def test_every_long_step_s_progress_is_its_job_progress_file(tmp_path, rule, output, unit):
    """One format for every family: status reads the file `gpuflow.job` writes, not a log."""
    log = tmp_path / "step.log"
    log.write_text("epoch 3/20 loss [1.0]\n1 seeds, 0 already done\n")  # never read
    writer = ProgressWriter(progress_path(tmp_path / output), total=20, unit=unit, resumed_at=1)
    writer.update(3)
    found = job_progress(job(rule, output, str(log)), tmp_path)
    assert (found.done, found.total, found.unit, found.resumed_at) == (3, 20, unit, 1)
    assert found.source == str(progress_path(tmp_path / output))
    progress_path(tmp_path / output).unlink()
    assert job_progress(job(rule, output, str(log)), tmp_path) is None, "no log is read"


def test_a_progress_file_of_any_output_of_the_job_is_found(tmp_path):
    out = tmp_path / "perplexity" / "shard~0.csv"
    write_progress(progress_path(out), done=300, total=1000, unit="texts", started=10.0)
    other = Job(rule="fluency_perplexity", local=False, output=["other.csv", str(out)], log=[])
    found = job_progress(other, tmp_path)
    assert (found.done, found.total, found.unit, found.started) == (300, 1000, "texts", 10)
    assert found.eta_s(now=found.updated) == pytest.approx((found.updated - 10) * 700 / 300)


def test_gpu_hours_used_come_from_a_telemetry_file_only_where_nvml_saw_the_gpus(tmp_path):
    output = tmp_path / "metrics.json"
    telemetry = job_file(output, RECORD)
    telemetry.parent.mkdir(parents=True)
    telemetry.write_text(json.dumps({"gpu": {"count": 2, "gpu_hours": 1.5}}))
    assert telemetry_gpu_hours(output) == 1.5
    telemetry.write_text(json.dumps({"gpu": {"absent": "NVML init failed", "count": 0}}))
    assert telemetry_gpu_hours(output) is None, "no GPU seen: the job's wall time counts"
    telemetry.unlink()
    assert telemetry_gpu_hours(output) is None


def test_failed_jobs_are_read_from_snakemakes_run_log(tmp_path):
    log = tmp_path / "run.log"
    log.write_text(
        "Error in rule ssvae_train:\n"
        "    message: SLURM-job '11' failed, SLURM status is: 'TIMEOUT'.\n"
        "    jobid: 0\n"
        "    output: results/a.json, results/b.json\n"
        "    log: results/logs/a.log, /x/.snakemake/slurm_logs/rule_ssvae_train/11.log"
        " (check log file(s) for error details)\n"
        "    external_jobid: 11\n"
        "Logfile results/logs/a.log:\n"
    )
    [failed] = failed_jobs(log)
    assert failed.output == ["results/a.json", "results/b.json"]
    assert failed.log == ["results/logs/a.log", "/x/.snakemake/slurm_logs/rule_ssvae_train/11.log"]
    assert failed.external_jobid == "11" and "TIMEOUT" in failed.message


def test_watch_prints_the_tables_again_plainly_when_not_on_a_terminal(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("steps: 1\nstep_seconds: 1\n", encoding="utf-8")
    command = [str(BIN / "gpuflow"), "status", "--watch", "0.1", "--snakefile", str(SNAKEFILE)]
    command += ["--directory", str(tmp_path), "--configfile", str(config)]
    watch = subprocess.Popen(command, env=workflow_env(), stdout=subprocess.PIPE, text=True)
    lines = []
    try:
        while sum("status read in" in line for line in lines) < 2:
            line = watch.stdout.readline()
            assert line, "watch ended by itself"
            lines.append(line)
    finally:
        watch.send_signal(signal.SIGINT)
        watch.wait(timeout=60)
    assert watch.returncode == 0, "Ctrl-C ends --watch quietly"
    text = "".join(lines)
    assert "\x1b[" not in text and text.count("family    rule") == 2
