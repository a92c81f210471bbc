"""`gpuflow status`: jobs counted from a real local Snakemake run, progress and ETA from files.

The small workflow of tests/slurm/status (a slow job writing its progress file, a job that fails,
a quick one) runs with the real Snakemake, under each of its persistence backends (`file`, the
default, and `db`), while `gpuflow status --json` looks at it; the same Snakefile runs on the
live cluster in tests/test_slurm_status.py. The readers of each family's progress are checked on
files written the way its step writes them.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from gpuflow.job.outputlock import read_holder
from gpuflow.job.paths import RECORD, job_file
from gpuflow.job.progress import ProgressWriter, progress_path, write_progress
from gpuflow.job.record import read_record
from gpuflow.job.record_tables import read_folder
from gpuflow.ops.plan import Job, plan_jobs
from gpuflow.ops.snakemake_adapter import Marker, failed_jobs, snakemake_started
from gpuflow.ops.status.collect import (
    KILLED,
    Seen,
    classify,
    last_error_line,
    telemetry_gpu_hours,
)
from gpuflow.ops.status.main import run_state
from gpuflow.ops.status.progress import Progress, job_progress
from gpuflow.ops.status.report import as_dict, render
from gpuflow.slurm.queue import SlurmJob
from tests.conftest import BIN, REPO, wait_for, wait_for_file, wait_while_running, workflow_env

SNAKEFILE = REPO / "tests" / "slurm" / "status" / "Snakefile"
BACKENDS = pytest.mark.parametrize("backend", ["file", "db"])
BROKEN = "results/logs/broken.log"


def slow_and_broken_seen(workdir: Path) -> bool:
    """Whether the files say `slow` has reported progress and `broken` has failed: only then is
    a `gpuflow status` (a whole DAG each) worth asking."""
    log = workdir / BROKEN
    ended = log.exists() and "on purpose" in log.read_text(encoding="utf-8")
    return ended and progress_path(workdir / "results/out/slow.txt").exists()


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


def run_command(workdir: Path, config: Path, backend: str, *args: str) -> list[str]:
    """The Snakemake command running the status workflow in `workdir` under `backend`."""
    command = [str(BIN / "snakemake"), "--snakefile", str(SNAKEFILE), "--directory", str(workdir)]
    return [*command, "--persistence-backend", backend, "--configfile", str(config), *args]


@BACKENDS
def test_status_during_and_after_a_local_run(tmp_path, backend):
    config = tmp_path / "config.yaml"
    config.write_text("steps: 600\nstep_seconds: 1\n", encoding="utf-8")
    command = run_command(tmp_path, config, backend, "--cores", "2", "--keep-going")
    args = ("--configfile", str(config))
    before = by_rule(status_json(tmp_path, *args))
    assert {rule: row["todo"] for rule, row in before.items()} == dict.fromkeys(
        ("quick", "slow", "broken"), 1
    )
    run = subprocess.Popen(command, env=workflow_env(), stderr=subprocess.PIPE, text=True)
    try:
        seen = "slow's progress and broken's failure"
        wait_while_running(lambda: slow_and_broken_seen(tmp_path), run, seen, 120, 0.2)
        deadline = time.monotonic() + 60
        while True:
            during = status_json(tmp_path, *args)
            running = [job for job in during["running"] if job["rule"] == "slow"]
            if running and running[0]["progress"] and during["failed"]:
                break
            assert run.poll() is None and time.monotonic() < deadline, during
            time.sleep(1)
        assert during["run_active"] and during["stale_lock"] is None
        assert during["persistence_backend"] == backend, "found without being named"
        assert by_rule(during)["slow"]["running"] == 1
        progress = running[0]["progress"]
        assert progress["unit"] == "steps" and progress["total"] == 600
        assert 1 <= progress["done"] < 600 and progress["eta_s"] is not None
        assert 0 < progress["eta_s"] <= 600 * 3
        assert running[0]["slurm_id"] is None
        [failed] = during["failed"]
        assert failed["rule"] == "broken" and failed["log"] == BROKEN
        assert failed["last_line"] == "ValueError: made to fail on purpose"
    finally:
        (tmp_path / "results" / "release").touch()
        run.wait(timeout=120)
    after = status_json(tmp_path, *args)
    rows = by_rule(after)
    assert (rows["quick"]["done"], rows["slow"]["done"], rows["broken"]["failed"]) == (1, 1, 1)
    assert after["totals"]["running"] == after["totals"]["queued"] == 0
    assert rows["slow"]["gpu_h_spent"] > 0, "1 GPU x Snakemake's recorded start to end"
    assert not after["run_active"] and after["running"] == [] and after["stale_lock"] is None
    assert after["failed"][0]["last_line"] == "ValueError: made to fail on purpose"
    # a later `snakemake --unlock` writes a log of its own: the failure is still the latest run's
    subprocess.run([*command[:9], "--unlock"], env=workflow_env(), check=True, capture_output=True)
    assert [job["rule"] for job in status_json(tmp_path, *args)["failed"]] == ["broken"]


@BACKENDS
def test_a_job_killed_with_its_run_is_left_incomplete_behind_a_stale_lock(tmp_path, backend):
    config = tmp_path / "config.yaml"
    config.write_text("steps: 60\nstep_seconds: 1\n", encoding="utf-8")
    command = run_command(tmp_path, config, backend, "--cores", "1", "results/out/slow.txt")
    run = subprocess.Popen(command, env=workflow_env(), start_new_session=True)
    progress = progress_path(tmp_path / "results" / "out" / "slow.txt")
    wait_for_file(progress, run, 60)
    os.killpg(run.pid, signal.SIGKILL)  # kill -9 of Snakemake and its step
    run.wait(timeout=30)
    args = ("results/out/slow.txt", "--configfile", str(config))
    status = status_json(tmp_path, *args)
    assert by_rule(status)["slow"]["incomplete"] == 1 and not status["run_active"]
    assert [job["output"] for job in status["incomplete"]] == [["results/out/slow.txt"]]
    unlock = status["stale_lock"]
    assert unlock.startswith("snakemake --unlock ") and str(tmp_path) in unlock
    assert ("--persistence-backend db" in unlock) == (backend == "db")
    # the killed step had written its output when it died: still incomplete, never done
    (tmp_path / "results" / "out" / "slow.txt").write_text("partial", encoding="utf-8")
    status = status_json(tmp_path, *args)
    assert by_rule(status)["slow"]["incomplete"] == 1 and by_rule(status)["slow"]["done"] == 0
    plan = plan_jobs(plan_args(tmp_path, config, "results/out/slow.txt"))
    assert [(job.rule, job.why) for job in plan.jobs] == [("slow", "incomplete")]
    planned = subprocess.run(
        [str(BIN / "gpuflow"), "plan", "--snakefile", str(SNAKEFILE), "--directory",
         str(tmp_path), *args], capture_output=True, text=True, env=workflow_env(), check=True,
    ).stdout  # fmt: skip
    assert (
        "Re-run after a partial failure: 1 jobs lack their outputs (1 left incomplete)" in planned
    )
    # the command status names removes the lock
    [_, *words] = shlex.split(unlock)
    subprocess.run([str(BIN / "snakemake"), *words], env=workflow_env(), check=True)
    assert status_json(tmp_path, *args)["stale_lock"] is None


def plan_args(workdir: Path, config: Path, *targets: str) -> argparse.Namespace:
    return argparse.Namespace(
        directory=str(workdir),
        profile=[],
        snakefile=str(SNAKEFILE),
        configfile=[str(config)],
        targets=list(targets),
        persistence_backend=None,
    )


SLOW = Job(rule="slow", local=False, output=["results/out/slow.txt"])


def seen_with_marker(workdir: Path, started: float, **run: Any) -> Seen:
    marker = Marker("results/out/slow.txt", started, external_jobid=None)
    return Seen(workdir, {marker.output: marker}, {}, [], **run)


def test_an_output_left_with_its_incomplete_marker_is_incomplete_not_done(tmp_path):
    output = tmp_path / "results" / "out" / "slow.txt"
    output.parent.mkdir(parents=True)
    output.write_text("partial", encoding="utf-8")
    assert classify(SLOW, seen_with_marker(tmp_path, 100.0, run_active=False)).state == (
        "incomplete"
    )
    assert classify(SLOW, Seen(tmp_path, {}, {}, [], run_active=False)).state == "done"


def test_a_marker_older_than_the_active_run_is_a_leftover_and_a_newer_one_is_running(tmp_path):
    def state(run_started: float) -> str:
        seen = seen_with_marker(tmp_path, 1000.0, run_active=True, run_started=run_started)
        return classify(SLOW, seen).state

    assert (state(1060.0), state(940.0)) == ("incomplete", "running")


def test_a_job_not_started_is_queued_while_a_run_is_active_and_todo_otherwise(tmp_path):
    assert classify(SLOW, Seen(tmp_path, {}, {}, [], run_active=True)).state == "queued"
    assert classify(SLOW, Seen(tmp_path, {}, {}, [], run_active=False)).state == "todo"
    pending = {"rule_slow": SlurmJob("12", "rule_slow", "PENDING")}
    assert classify(SLOW, Seen(tmp_path, {}, pending, [], run_active=True)).state == "queued"


def test_a_recorded_failure_stands_unless_a_run_started_after_it(tmp_path):
    record = job_file(tmp_path / "results/out/slow.txt", RECORD)
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"status": "failed (ValueError)", "ended": 1000.0}))

    def state(run_active: bool, run_started: float | None = None) -> str:
        return classify(SLOW, Seen(tmp_path, {}, {}, [], run_active, run_started)).state

    assert state(run_active=False) == "failed"
    assert state(run_active=True, run_started=900.0) == "failed", "it failed in the active run"
    assert state(run_active=True, run_started=1100.0) == "queued", "the active run retries it"
    killed_later = seen_with_marker(tmp_path, 1200.0, run_active=False)
    assert classify(SLOW, killed_later).state == "incomplete", "a later attempt was killed"
    record.write_text(json.dumps({"status": "finished", "ended": 1000.0}))
    assert state(run_active=False) == "todo"
    # a record written when its step started, never ended, and no holder of the output lock
    started = {"status": "running", "started": 1000.0, "host": socket.gethostname()}
    record.write_text(json.dumps(started))
    assert state(run_active=False) == "failed", "killed here"
    assert state(run_active=True, run_started=1100.0) == "queued", "the active run retries it"
    record.write_text(json.dumps({**started, "host": "another-node"}))
    assert state(run_active=False) == "todo", "a step on another host is SLURM's to tell"


def test_with_slurm_unreachable_a_job_the_run_submitted_is_running_once_its_step_started(
    tmp_path,
):
    """Its marker names its SLURM job; without SLURM's answer its job record tells whether its
    step started (running) or not yet (queued). Where SLURM answers and no longer knows the job,
    the job is left incomplete."""
    marker = Marker("results/out/slow.txt", 1000.0, external_jobid="11")
    down = "squeue: Unable to contact slurm controller (connect failure)"

    def state(slurm_unreachable: str | None) -> str:
        markers = {marker.output: marker}
        seen = Seen(tmp_path, markers, {}, [], True, 990.0, slurm_unreachable=slurm_unreachable)
        return classify(SLOW, seen).state

    assert (state(down), state(None)) == ("queued", "incomplete")
    record = job_file(tmp_path / "results/out/slow.txt", RECORD)
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"status": "running", "started": 1005.0, "host": "node1"}))
    assert (state(down), state(None)) == ("running", "incomplete")
    record.write_text(json.dumps({"status": "running", "started": 900.0, "host": "node1"}))
    assert state(down) == "queued", "the record of an earlier attempt"


def test_a_snakemake_process_counts_only_in_the_folder_it_works_in(tmp_path):
    fake = tmp_path / "bin" / "snakemake"  # a process whose command is `snakemake`
    fake.parent.mkdir()
    fake.symlink_to("/bin/sleep")
    (tmp_path / "run").mkdir()
    before = time.time()
    process = subprocess.Popen([str(fake), "30"], cwd=tmp_path / "run")
    try:
        # Popen returns once exec closed its pipe; the kernel fills in the new command line
        # a moment later, and on a busy machine a reader can see it still empty.
        cmdline = Path(f"/proc/{process.pid}/cmdline")
        wait_for(cmdline.read_bytes, "the fake snakemake's command line", 10, interval=0.01)
        started = snakemake_started(tmp_path / "run")
        assert started is not None and before - 1 <= started <= time.time() + 1
        assert snakemake_started(tmp_path) is None
    finally:
        process.kill()
        process.wait()
    assert snakemake_started(tmp_path / "run") is None


def test_orphaned_slurm_jobs_of_the_folder_keep_the_run_active_after_an_unlock():
    orphan = {"slow": SlurmJob("11", "rule_slow", "RUNNING", "2026-11-23T07:28:52")}
    queued = {"slow": SlurmJob("12", "rule_slow", "PENDING")}
    finished = {"slow": SlurmJob("11", "rule_slow", "COMPLETED")}
    assert run_state(locked=False, snakemake_since=None, slurm=orphan).active
    assert run_state(locked=False, snakemake_since=None, slurm=queued).active
    assert not run_state(locked=False, snakemake_since=None, slurm=finished).active
    assert run_state(locked=True, snakemake_since=None, slurm=orphan).stale_lock is False


def test_a_lock_without_a_live_snakemake_or_slurm_job_is_stale_and_named_with_its_unlock(
    tmp_path,
):
    assert run_state(locked=True, snakemake_since=None, slurm={}).stale_lock
    live = run_state(locked=True, snakemake_since=1000.0, slurm={})
    assert (live.active, live.started, live.stale_lock) == (True, 1000.0, False)
    unlock = "snakemake --unlock --directory /x --persistence-backend db"
    seen = Seen(tmp_path, {}, {}, [], run_active=False, stale_lock=unlock)
    text = render(as_dict([], [], seen), 0.1)
    assert "stale lock: a killed run left Snakemake's lock here" in text and unlock in text


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
    assert telemetry_gpu_hours(read_record(telemetry) or {}) == 1.5
    telemetry.write_text(json.dumps({"gpu": {"absent": "NVML init failed", "count": 0}}))
    assert telemetry_gpu_hours(read_record(telemetry) or {}) is None, (
        "no GPU seen: the job's wall time counts"
    )
    telemetry.unlink()
    assert telemetry_gpu_hours(read_record(telemetry) or {}) is None


FAILING_STEP = """
rule all:
    input: 'results/table.csv', 'results/other.txt'

rule aggregate:
    input: 'shard.csv'
    output: summary='results/summary.csv', table='results/table.csv'
    log: 'results/logs/aggregate.log'
    shell: 'gpuflow sweep-aggregate --shards {input} --out {output.table}'
           ' --out-summary {output.summary} > {log} 2>&1'

rule other:
    output: 'results/other.txt'
    shell: 'echo ok > {output}'
"""


def test_a_failed_step_stays_failed_after_later_runs_from_its_job_record(tmp_path):
    """The latest run log knows only the jobs of its own run; the job record of a gpuflow step
    keeps its last attempt's failure and error until a run retries it. The rule lists its
    outputs in another order than the step's (as fluency_stats does): the record is found
    under whichever output names it."""
    snakefile = tmp_path / "Snakefile"
    snakefile.write_text(FAILING_STEP, encoding="utf-8")
    (tmp_path / "shard.csv").write_text("seed,error\n0,0.5\n", encoding="utf-8")
    command = [str(BIN / "snakemake"), "--snakefile", str(snakefile), "--cores", "1"]
    env = workflow_env()

    def run(*args: str) -> None:
        subprocess.run([*command, *args], cwd=tmp_path, env=env, capture_output=True, check=False)

    def failed() -> list[dict[str, Any]]:
        result = subprocess.run(
            [str(BIN / "gpuflow"), "status", "--json", "--snakefile", str(snakefile)],
            cwd=tmp_path, env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        return json.loads(result.stdout)["failed"]

    run("--keep-going")
    assert [job["rule"] for job in failed()] == ["aggregate"]
    run("results/other.txt", "--forcerun", "other")  # a later run: its log says nothing of it
    [job] = failed()
    assert job["rule"] == "aggregate" and job["log"] == "results/logs/aggregate.log"
    assert "shard.csv: missing columns ['method'" in job["last_line"]
    (tmp_path / "results" / "logs" / "aggregate.log").unlink()
    [job] = failed()
    assert job["last_line"].startswith("failed (DataError): shard.csv: missing columns")


KILLED_STEP = """
import json

rule shard:
    output: table='results/shard.csv', run='results/shard.run.json'
    log: 'results/logs/shard.log'
    params:
        settings=json.dumps({"data": {"seed": 0, "input_dim": 8, "output_dim": 8, "n_train": 4,
            "label_noise": 0.0}, "gnc": {"loss_threshold": 1e-9, "max_guesses": 80000,
            "batch_size": 4096}}),
        runtime=json.dumps({"device": "cpu", "cpu_workers": 1}),
    shell: 'gpuflow sweep-shard --method gnc --teacher-rank 2 --student-width 4 --seeds 0:20000'
           ' --settings {params.settings:q} --runtime {params.runtime:q} --out {output.table}'
           ' --run-out {output.run} > {log} 2>&1'

rule other:
    output: 'results/other.txt'
    shell: 'echo ok > {output}'
"""


def test_a_step_killed_under_a_live_run_stays_failed_after_later_runs(tmp_path):
    """A SIGKILL (the out-of-memory killer's) leaves a step no time to end its job record: the
    record it wrote when it started, with no live holder of its output lock, says it was killed,
    after the run that saw it die and after later runs too. The family reports and the plan read
    only ended records."""
    snakefile = tmp_path / "Snakefile"
    snakefile.write_text(KILLED_STEP, encoding="utf-8")
    command = [str(BIN / "snakemake"), "--snakefile", str(snakefile), "--cores", "1"]
    env = workflow_env()

    def status() -> dict[str, Any]:
        result = subprocess.run(
            [str(BIN / "gpuflow"), "status", "--json", "--snakefile", str(snakefile)],
            cwd=tmp_path, env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        return json.loads(result.stdout)

    table = tmp_path / "results" / "shard.csv"
    run = subprocess.Popen(
        [*command, "results/shard.csv"], cwd=tmp_path, env=env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for(lambda: read_record(job_file(table, RECORD)), "the record of the step", 120)
        during = status()
        assert [job["rule"] for job in during["running"]] == ["shard"] and not during["failed"]
        os.kill(int((read_holder(table) or {})["pid"]), signal.SIGKILL)
        assert run.wait(timeout=60) != 0
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    [job] = status()["failed"]
    assert job["rule"] == "shard" and job["last_line"] == KILLED
    subprocess.run([*command, "results/other.txt"], cwd=tmp_path, env=env, check=True,
                   capture_output=True)  # fmt: skip
    after = status()
    assert [(job["rule"], job["last_line"]) for job in after["failed"]] == [("shard", KILLED)]
    assert by_rule(after)["shard"]["failed"] == 1
    assert read_folder(tmp_path / "results") == {}, "no report lists a step that never ended"


def test_a_file_that_changed_while_snakemake_read_the_folder_is_read_again(tmp_path):
    """A live run's job can create an output between Snakemake's two looks at it (its
    "broken symlink" check: missing, then there); the status of the moment is read again
    rather than failing. Here the first look at `out.txt` fails as that check does."""
    snakefile = tmp_path / "Snakefile"
    snakefile.write_text(
        "from pathlib import Path\n"
        "from snakemake.exceptions import WorkflowError\n\n"
        "def out(wildcards):\n"
        "    if not Path('looked-once').exists():\n"
        "        Path('looked-once').touch()\n"
        "        raise WorkflowError('File out.txt seems to be a broken symlink.')\n"
        "    return 'out.txt'\n\n"
        "rule all:\n    input: out\n\n"
        "rule out:\n    output: 'out.txt'\n    shell: 'echo ok > {output}'\n"
    )
    command = [str(BIN / "gpuflow"), "status", "--json", "--snakefile", str(snakefile)]
    result = subprocess.run(
        [*command, "--directory", str(tmp_path)], capture_output=True, text=True,
        env=workflow_env(), check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "looked-once").exists()
    assert [row["rule"] for row in json.loads(result.stdout)["rules"]] == ["out"]


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


SCANCELLED_TRAINING_LOG = """\
epoch 3/20 loss [0.41]
gpuflow scaling-train: error: stopped by SIGTERM after epoch 3 (state saved in run.ckpt)
W1123 07:30:01 torch/distributed/elastic/agent/server/api.py:704] Received 15 death signal
Traceback (most recent call last):
  File "/venv/bin/torchrun", line 8, in <module>
    sys.exit(main())
torch.distributed.elastic.multiprocessing.api.SignalException: Process 4242 got signal: 15
"""


def test_a_stopped_step_s_last_error_is_gpuflow_s_own_line_over_a_launcher_s_after_it(
    tmp_path,
):
    log = tmp_path / "train.log"
    log.write_text(SCANCELLED_TRAINING_LOG, encoding="utf-8")
    assert last_error_line(["train.log"], tmp_path) == (
        "train.log",
        "gpuflow scaling-train: error: stopped by SIGTERM after epoch 3 (state saved in run.ckpt)",
    )
    without_own_line = SCANCELLED_TRAINING_LOG.replace("gpuflow scaling-train: error: ", "")
    log.write_text(without_own_line, encoding="utf-8")
    assert last_error_line(["train.log"], tmp_path)[1].endswith("got signal: 15")


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
