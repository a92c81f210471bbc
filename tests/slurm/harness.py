"""Run a workflow through the SLURM profile on the test cluster, and read SLURM's own records.

Reusable for any Snakefile and config: `run_profile` (snakemake --profile profiles/slurm with
the test cluster's site values, optionally cancelling a job mid-run), `run_whole_node` (the
whole-node batch script), `slurm_job` (scontrol's record of a job), and helpers over the run
records that gpuflow steps write (gpuflow.job.devices.run_record plus start/end times).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TEST_SITE = REPO / "tests" / "slurm" / "site.yaml"
TEST_PROFILE = REPO / "tests" / "slurm" / "profile"
WHOLE_NODE = REPO / "scripts" / "whole-node.sbatch"


def cluster_env() -> dict[str, str]:
    """Environment for snakemake and sbatch: this venv first, the test site file."""
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["GPUFLOW_SLURM_SITE"] = str(TEST_SITE)
    env.pop("GPUFLOW_GPU_LOCK_DIR", None)
    return env


def write_config(workdir: Path, config: dict[str, Any]) -> Path:
    """Write `config` as workdir/test-config.yaml and return its path."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "test-config.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def squeue(run_filter: str = "") -> list[dict[str, str]]:
    """Jobs SLURM knows (pending, running and recently ended): id, state, comment, name."""
    result = subprocess.run(
        ["squeue", "--states=all", "--noheader", "--format=%i|%T|%k|%j"],
        capture_output=True,
        text=True,
        check=True,
    )
    jobs = []
    for line in result.stdout.splitlines():
        job_id, state, comment, name = line.strip().split("|", 3)
        if run_filter in comment:
            jobs.append({"id": job_id, "state": state, "comment": comment, "name": name})
    return jobs


def workdir_jobs(workdir: Path) -> list[dict[str, str]]:
    """Jobs submitted from `workdir` that SLURM still lists (squeue keeps ended ones for its
    MinJobAge): id, state, comment, start and end time, time used and left, oldest first (an
    array task's id is <job>_<task>, a pending array's <job>_[<tasks>])."""
    listed = subprocess.run(
        ["squeue", "--states=all", "--noheader", "--format=%i|%T|%k|%S|%e|%M|%L|%Z"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    jobs = []
    for line in listed.splitlines():
        job_id, state, comment, start, end, used, left, directory = line.strip().split("|", 7)
        if Path(directory) == workdir:
            fields = {"id": job_id, "state": state, "comment": comment}
            jobs.append({**fields, "start": start, "end": end, "used": used, "left": left})
    return sorted(jobs, key=lambda job: [int(n) for n in re.findall(r"\d+", job["id"])])


def seconds_left(left: str) -> float:
    """squeue's time left or used (`[days-][hours:]minutes:seconds`) in seconds; infinite when
    the job has no limit."""
    days, _, clock = left.rpartition("-")
    if not re.fullmatch(r"[\d:]+", clock):
        return float("inf")
    seconds = 0
    for part in clock.split(":"):
        seconds = seconds * 60 + int(part)
    return seconds + int(days or 0) * 86400


def written_since_start(path: Path, job: dict[str, str]) -> bool:
    """Whether `path` exists and was last written after `job` (last) started."""
    try:
        written = path.stat().st_mtime
        started = datetime.fromisoformat(job["start"]).timestamp()
    except (FileNotFoundError, ValueError):
        return False
    return written >= started


def follow_log(path: Path, attempts: list[str], stop: threading.Event) -> None:
    """Collect every run's text of a log that each run truncates (`> {log}`) into `attempts`.

    The log may go between a check that it exists and the read (it did once in a full run, as
    the failed attempt was cleaned up): a log that is gone reads as empty."""
    while not stop.wait(0.3):
        try:
            text = path.read_text(errors="replace")
        except FileNotFoundError:
            text = ""
        if attempts and text.startswith(attempts[-1]):
            attempts[-1] = text
        elif text or not attempts:
            attempts.append(text)


def cancel_when_running(
    workdir: Path,
    rule: str,
    started: Path | None,
    cancelled: list[str],
    stop: threading.Event,
    command: tuple[str, ...] = ("scancel",),
    min_left_s: float = 0,
    left_over_used: bool = False,
) -> None:
    """End the first job of `rule` submitted from `workdir` with `command` (scancel; or
    `scontrol requeue`, as when SLURM preempts it) once it runs, (if given) `started` was
    written since the job started, and at least `min_left_s` of its time limit remain (with
    `left_over_used`, also at least the time it has run).

    `started` is a file the step writes once it has begun (its log, its saved state): the job
    is ended in the middle of the step, not while Snakemake starts. `min_left_s` keeps the end
    clear of the job's own limit (a requeue that races SLURM's timeout is lost); a requeued job
    starts again with its whole limit, so `left_over_used` gives its restart at least twice the
    time this start took to write `started` (on a loaded machine a 1-minute restart can spend
    its limit starting Snakemake and never run its step; seen in CI). A job that saved too late
    is let go and a later attempt, with a longer limit, is ended. Its id goes into `cancelled`.
    Jobs of other folders (other test sessions share the cluster) are never touched.
    """
    while not stop.wait(0.5):
        ready = [
            job
            for job in workdir_jobs(workdir)
            if job["comment"].startswith(f"rule_{rule}")
            and job["state"] == "RUNNING"
            and (started is None or written_since_start(started, job))
            and seconds_left(job["left"]) >= max(min_left_s, ran_s(job, left_over_used)) + 1
        ]
        if ready:
            time.sleep(1)
            subprocess.run([*command, ready[0]["id"]], check=True)
            cancelled.append(ready[0]["id"])
            if command[0] == "scancel":
                end_leftovers(ready[0]["id"])
            return


def ran_s(job: dict[str, str], counted: bool) -> float:
    """The seconds `job` has run (squeue's time used) if `counted`, else 0."""
    return seconds_left(job["used"]) if counted else 0.0


def job_processes(job_id: str) -> list[int]:
    """The processes still carrying SLURM_JOB_ID=`job_id`."""
    return processes_with(f"SLURM_JOB_ID={job_id}")


def processes_with(entry: str) -> list[int]:
    """The processes (but this one) whose environment holds `entry` (NAME=value)."""
    mark, found = entry.encode(), []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if mark in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def end_leftovers(job_id: str, grace_s: float = 5.0) -> list[int]:
    """After `grace_s`, SIGKILL every process still carrying SLURM_JOB_ID=`job_id`, as a real
    cluster's cgroups end every process of a cancelled job. Under proctrack/linuxproc (see
    tests/slurm/cluster.py) the processes under the in-job Snakemake can be lost: a cancelled
    probe ran on for its whole 300 s hold."""
    time.sleep(grace_s)
    killed = []
    for pid in job_processes(job_id):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
        killed.append(pid)
    return killed


def profile_command(
    workdir: Path, snakefile: Path, config: dict[str, Any], *args: str
) -> list[str]:
    """snakemake --profile profiles/slurm (+ the test layer) for `workdir`; writes its config."""
    configfile = write_config(workdir, config)
    command = [
        str(BIN / "snakemake"),
        "--profile",
        str(REPO / "profiles" / "slurm"),
        "--profile",
        str(TEST_PROFILE),
        "--snakefile",
        str(snakefile),
        "--directory",
        str(workdir),
        *args,
        # last: --configfile takes every word that follows (targets would become configfiles)
        "--configfile",
        str(configfile),
    ]
    return command


def run_profile(
    workdir: Path,
    snakefile: Path,
    config: dict[str, Any],
    *args: str,
    cancel_rule: str | None = None,
    cancel_after: str | None = None,
    cancel_command: tuple[str, ...] = ("scancel",),
    cancel_min_left_s: float = 0,
    cancel_left_over_used: bool = False,
    watchers: Iterable[Callable[[threading.Event], None]] = (),
    env: dict[str, str] | None = None,
    timeout: int = 600,
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """snakemake --profile profiles/slurm (+ the test layer) in `workdir`.

    With `cancel_rule`, the first job of that rule that runs, has written the file
    `cancel_after` (relative to `workdir`, e.g. the step's log) and has at least
    `cancel_min_left_s` of its time limit left (with `cancel_left_over_used`, also at least the
    time it has run) is ended with `cancel_command` (scancel, or `scontrol requeue` as on
    preemption). Each of `watchers` runs in a thread of its own while
    Snakemake runs, until the event it is given is set. `env` adds to the environment.
    Returns the finished process and the ids of the cancelled jobs.
    """
    command = profile_command(workdir, snakefile, config, *args)
    cancelled: list[str] = []
    stop = threading.Event()
    threads = [threading.Thread(target=watch, args=(stop,), daemon=True) for watch in watchers]
    if cancel_rule:
        started = workdir / cancel_after if cancel_after else None
        threads.append(
            threading.Thread(
                target=cancel_when_running,
                args=(workdir, cancel_rule, started, cancelled, stop),
                kwargs={
                    "command": cancel_command,
                    "min_left_s": cancel_min_left_s,
                    "left_over_used": cancel_left_over_used,
                },
                daemon=True,
            )
        )
    for thread in threads:
        thread.start()
    try:
        result = subprocess.run(
            command,
            capture_output=True,
            text=True,
            env={**cluster_env(), **(env or {})},
            timeout=timeout,
            cwd=REPO,
        )
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=5)
    return result, cancelled


def run_whole_node(
    workdir: Path,
    snakefile: Path,
    config: dict[str, Any],
    sbatch_args: Iterable[str],
    timeout: int = 300,
) -> tuple[str, str]:
    """Submit scripts/whole-node.sbatch for this workflow and wait: (job state, job log)."""
    configfile = write_config(workdir, config)
    log = workdir / "whole-node.log"
    submitted = subprocess.run(
        [
            "sbatch",
            "--parsable",
            f"--output={log}",
            *sbatch_args,
            str(WHOLE_NODE),
            "--snakefile",
            str(snakefile),
            "--directory",
            str(workdir),
            "--configfile",
            str(configfile),
        ],
        capture_output=True,
        text=True,
        env=cluster_env(),
        cwd=REPO,
        check=True,
    )
    job_id = submitted.stdout.strip().split(";")[0]
    deadline = time.monotonic() + timeout
    state = "PENDING"
    while time.monotonic() < deadline:
        state = slurm_job(job_id).get("JobState", "UNKNOWN")
        if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            break
        time.sleep(1)
    else:
        subprocess.run(["scancel", job_id], check=False)
    return state, log.read_text(errors="replace") if log.exists() else ""


def slurm_job(job_id: str) -> dict[str, str]:
    """SLURM's record of one job (scontrol show job), as key=value pairs."""
    result = subprocess.run(
        ["scontrol", "show", "job", "--oneliner", str(job_id)],
        capture_output=True,
        text=True,
        check=True,
    )
    fields: dict[str, str] = {}
    for token in result.stdout.split():
        key, _, value = token.partition("=")
        fields.setdefault(key, value)
    return fields


def ended_at(job_id: str) -> float:
    """When SLURM ended a job (scontrol's EndTime), in seconds since the epoch."""
    return datetime.fromisoformat(slurm_job(job_id)["EndTime"]).timestamp()


def error_reported_at(log: str, rule: str) -> float:
    """When Snakemake reported the first failed job of `rule` (the time stamp it prints above
    `Error in rule <rule>:`), in seconds since the epoch."""
    stamp = re.search(rf"^\[(.+)\]\nError in rule {rule}:", log, re.M)
    assert stamp, f"no error of {rule} in the log"
    return datetime.strptime(stamp.group(1), "%a %b %d %H:%M:%S %Y").timestamp()


def run_id(log: str) -> str:
    """A run's SLURM job name (gpuflow_<uuid>), as the plugin logs it."""
    [line] = [line for line in log.splitlines() if "SLURM run ID:" in line]
    return line.split("SLURM run ID:")[1].strip()


def sacct_jobs(name: str, fields: str) -> list[list[str]]:
    """sacct -X (one row a job) of the jobs named `name`: the comma-separated `fields` of each."""
    command = ["sacct", "-X", "--noheader", "--parsable2", f"--name={name}", f"--format={fields}"]
    listed = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return [line.split("|") for line in listed.splitlines()]


def sacct_jobs_of(job_id: str, fields: str) -> list[list[str]]:
    """sacct -X -D of one job: the comma-separated `fields` of each of its records (a
    requeued job keeps one per start)."""
    command = ["sacct", "-X", "-D", "--noheader", "--parsable2", "-j", job_id, f"--format={fields}"]
    listed = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return [line.split("|") for line in listed.splitlines()]


def controller_answers() -> bool:
    """Whether slurmctld answers a ping."""
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, check=False)
    return "UP" in ping.stdout


def gpu_allocations(name: str) -> list[dict[str, Any]]:
    """SLURM's accounting of the jobs named `name` that held GPUs (AccountingStorageTRES=gres/gpu
    puts their GPUs in AllocTRES): id, GPU count, and when the allocation began and ended (epoch
    seconds, sacct's whole seconds). Read after every job ended."""
    allocations = []
    for job_id, tres, start, end in sacct_jobs(name, "JobIDRaw,AllocTRES,Start,End"):
        gpus = re.search(r"gres/gpu=(\d+)", tres)
        if gpus:
            allocations.append(
                {
                    "id": job_id,
                    "gpus": int(gpus.group(1)),
                    "start": datetime.fromisoformat(start).timestamp(),
                    "end": datetime.fromisoformat(end).timestamp(),
                }
            )
    return allocations


def read_records(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """The JSON run records written by gpuflow steps."""
    return [json.loads(Path(p).read_text()) for p in paths]


def max_concurrent(records: list[dict[str, Any]]) -> int:
    """Most records whose [start, end] intervals overlap at one moment (intervals that only
    touch do not)."""
    events = sorted(
        [(r["start"], 1) for r in records] + [(r["end"], -1) for r in records],
        key=lambda e: (e[0], e[1]),
    )
    running = peak = 0
    for _, change in events:
        running += change
        peak = max(peak, running)
    return peak


def overlapping_pairs(records: list[dict[str, Any]]) -> list[tuple[dict, dict]]:
    """Pairs of records that ran at the same time."""
    return [
        (a, b)
        for i, a in enumerate(records)
        for b in records[i + 1 :]
        if a["start"] < b["end"] and b["start"] < a["end"]
    ]
