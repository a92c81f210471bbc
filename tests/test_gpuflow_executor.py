"""gpuflow's SLURM executor, without a cluster: the states it acts on, the outage it waits out,
the submissions it tries again and the nodes it excludes (the live cluster shows the same in
tests/test_slurm_faults.py)."""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from snakemake_interface_common.exceptions import WorkflowError

import snakemake_executor_plugin_gpuflow_slurm as plugin
from snakemake_executor_plugin_gpuflow_slurm import (
    Executor,
    FailedNodes,
    Outage,
    check_version,
    job_state,
    node_names,
)

UNREACHABLE = "sbatch: error: Batch job submission failed: Unable to contact slurm controller"


@pytest.mark.parametrize(
    ("reported", "requeue", "acted_on"),
    [
        ("CANCELLED by 0", True, "CANCELLED"),
        ("CANCELLED by 1000", False, "CANCELLED"),
        ("RUNNING", True, "RUNNING"),
        ("COMPLETED", False, "COMPLETED"),
        ("FAILED", True, "FAILED"),
        ("PREEMPTED", True, "PREEMPTED"),
        ("PREEMPTED", False, "FAILED"),
        ("NODE_FAIL", True, "NODE_FAIL"),
        ("NODE_FAIL", False, "FAILED"),
        ("REVOKED", True, "FAILED"),
        ("SPECIAL_EXIT", True, "FAILED"),
        ("UNKNOWN", True, "FAILED"),
        ("", True, "FAILED"),
    ],
)
def test_a_state_the_plugin_knows_no_rule_for_ends_the_job(reported, requeue, acted_on):
    assert job_state(reported, requeue) == acted_on


def test_failed_nodes_are_node_names_and_none_assigned_is_none():
    assert node_names("None assigned") == []
    assert node_names("(null)") == []
    assert node_names("gpu36 gpu37") == ["gpu36", "gpu37"]
    assert node_names("gpu36;rm -rf") == []


def fake_program(folder: Path, name: str, script: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)


def test_a_failed_node_is_excluded_only_while_its_partitions_keep_another_node_up(
    tmp_path, monkeypatch
):
    fake = tmp_path / "bin"
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    nodes = FailedNodes("None assigned,gpu36")
    fake_program(fake, "sinfo", "printf 'gpu gpu36 idle\\ngpu gpu37 mixed\\ncpu c1 idle\\n'")
    assert sorted(nodes) == ["gpu36"] and bool(nodes)
    assert ",".join(nodes) == "gpu36", "what the plugin puts after --exclude="
    fake_program(fake, "sinfo", "printf 'gpu gpu36 down*\\ngpu gpu37 down*\\nmulti m1 idle\\n'")
    assert list(nodes) == [] and not nodes, "partition gpu keeps no node up: no exclusion"
    fake_program(fake, "sinfo", "printf 'gpu gpu36 idle\\nmulti m1 idle\\nmulti m2 idle\\n'")
    assert list(nodes) == [], "gpu36 is the only node of gpu, whatever other partitions have"


def test_an_outage_pauses_longer_and_longer_then_ends_the_run_in_one_line(monkeypatch):
    clock = iter([0.0, 1.0, 25.0, 61.0, 400.0])
    monkeypatch.setattr(plugin.time, "monotonic", lambda: next(clock))
    outage = Outage(minutes=5, logger=logging.getLogger("test"))
    pauses = [
        outage.failed("sacct", "sacct: error: Unable to contact slurm controller") for _ in range(4)
    ]
    assert pauses == sorted(pauses) and pauses[-1] <= plugin.LONGEST_PAUSE_S
    with pytest.raises(WorkflowError) as stopped:
        outage.failed("sacct", "sacct: error: Unable to contact slurm controller")
    assert str(stopped.value).startswith(
        "SLURM did not answer for 6.7 minutes (sacct: sacct: error"
    )
    assert "run the same command again" in str(stopped.value)


def test_an_untested_plugin_version_stops_with_one_line():
    check_version("2.8.3")
    with pytest.raises(
        WorkflowError, match=r"extends snakemake-executor-plugin-slurm 2\.8\.x, found 2\.9\.0"
    ):
        check_version("2.9.0")


def bare_executor(requeue: bool = True) -> Executor:
    """An Executor with just what the methods tested here read (no workflow, no thread)."""
    executor = Executor.__new__(Executor)
    executor.workflow = SimpleNamespace(executor_settings=SimpleNamespace(requeue=requeue))
    executor.logger = logging.getLogger("test")
    executor._outage = Outage(minutes=1, logger=executor.logger)
    executor._failed_nodes = FailedNodes(None)
    executor._captured = threading.local()
    executor._stopping = threading.Event()
    executor._main_event_loop = None
    executor.active_jobs = []
    executor.run_uuid = "gpuflow_test"
    return executor


def test_status_queries_are_tried_again_until_slurm_answers(tmp_path, monkeypatch):
    fake = tmp_path / "bin"
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    tries = tmp_path / "tries"
    fake_program(
        fake,
        "sacct",
        f"echo x >> {tries}\n"
        f"if [ $(wc -l < {tries}) -lt 3 ]; then echo 'sacct: error: Unable to contact slurm"
        " controller' >&2; exit 1; fi\nprintf '5|CANCELLED by 0\\n6|RUNNING\\n'",
    )
    monkeypatch.setattr(plugin.Outage, "failed", lambda self, what, error: 0.01)
    executor = bare_executor()
    states, _ = asyncio.run(executor.query_job_status("sacct -X --name gpuflow_test", None))
    assert states == {"5": "CANCELLED", "6": "RUNNING"}
    assert len(tries.read_text().split()) == 3


def test_a_submission_refused_for_want_of_the_controller_is_tried_again(monkeypatch):
    executor = bare_executor()
    reported: list[str] = []
    monkeypatch.setattr(executor, "report_job_error", lambda info, msg: reported.append(msg))
    monkeypatch.setattr(executor, "_cancel_twins", lambda jobs: None)
    monkeypatch.setattr(plugin.Outage, "failed", lambda self, what, error: 0.01)
    job, other = SimpleNamespace(name="train"), SimpleNamespace(name="figure")
    tries: list[list] = []

    def submit(jobs: list) -> None:
        tries.append(list(jobs))
        if len(tries) < 3:
            executor._report_job_error_threadsafe(SimpleNamespace(job=job), UNREACHABLE)
        if len(tries) == 1:
            executor._report_job_error_threadsafe(SimpleNamespace(job=other), "invalid account")

    executor._submitted([job, other], submit)
    assert tries == [[job, other], [job], [job]], "only the refused job again, until it goes"
    assert reported == ["invalid account"], "a real failure is reported at once"


ONE_RULE = """
rule train:
    output: "model.txt"
    resources: mem_mb=lambda wc, attempt: 1500 * attempt, runtime=lambda wc, attempt: 15 * attempt
    shell: "touch {output}"
"""


def run_through_an_outage(tmp_path: Path, answering: dict[str, str]) -> tuple[int, str]:
    """Snakemake through gpuflow's executor, with the profile's retries and keep-going, on a
    host whose SLURM commands all fail "Unable to contact slurm controller" but those of
    `answering` (command: what it prints); the outage is waited out for 1.2 s. Exit status and
    log."""
    fake = tmp_path / "bin"
    for command in ("sbatch", "sacct", "sacctmgr", "sinfo", "squeue", "scontrol", "scancel"):
        refused = f"echo '{command}: error: Unable to contact slurm controller' >&2; exit 1"
        fake_program(fake, command, answering.get(command, refused))
    (tmp_path / "Snakefile").write_text(ONE_RULE)
    done = subprocess.run(
        [sys.executable, "-m", "snakemake", "--executor", "gpuflow-slurm", "--jobs", "1",
         "--retries", "2", "--keep-going", "--gpuflow-slurm-outage-minutes", "0.02",
         "--gpuflow-slurm-init-seconds-before-status-checks", "1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"},
    )  # fmt: skip
    return done.returncode, done.stderr


def ended_by_the_outage_alone(code: int, log: str) -> None:
    """The run stopped with the outage's one line, and no job was counted as failed: none
    restarted as a later attempt, with more memory and time."""
    assert code == 1, log[-3000:]
    assert "WorkflowError:\nSLURM did not answer for " in log, log[-3000:]
    assert "run the same command again" in log
    assert "Trying to restart job" not in log, "an outage used up a retry"
    assert "mem_mb=3000" not in log and "Error in rule" not in log, log[-3000:]


def test_submissions_refused_past_the_outage_stop_the_run_without_using_a_retry(tmp_path):
    ended_by_the_outage_alone(*run_through_an_outage(tmp_path, answering={}))


def test_status_queries_refused_past_the_outage_stop_the_run_without_using_a_retry(tmp_path):
    code, log = run_through_an_outage(
        tmp_path, answering={"sbatch": "echo 5", "sinfo": "printf 'PARTITION\\ncpu*\\n'"}
    )
    assert "submitted with SLURM jobid 5" in log, log[-3000:]
    ended_by_the_outage_alone(code, log)


def test_in_a_job_each_job_step_s_snakemake_runs_under_the_signal_forwarder(monkeypatch):
    """proctrack/cgroup signals only a job step's first process: that is gpuflow.job.forward
    (tests/test_forward.py; live, under cgroup: tests/test_slurm_stop_resume.py)."""
    import snakemake_executor_plugin_slurm_jobstep as jobstep

    own = jobstep.Executor.get_python_executable
    monkeypatch.setattr(jobstep.Executor, "get_python_executable", own)
    plugin.forward_step_signals()
    plugin.forward_step_signals()  # the Snakefile may be read twice in one process
    python = shlex.quote(sys.executable)
    assert jobstep.Executor.get_python_executable(None) == (
        f"{python} -m gpuflow.job.forward -- {python}"
    )
