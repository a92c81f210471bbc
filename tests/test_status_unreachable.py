"""`gpuflow status` with the SLURM controller down waits on no SLURM command and says so.

squeue, sacct and scontrol are stand-ins first on PATH that note each call, wait a minute, then
say they could not contact the controller (as SLURM's commands do after retrying); the run is a
finished local run of the status workflow (tests/slurm/status), whose states then come from its
files alone. squeue is given 2 s, sacct is then not asked, and scontrol, which the SLURM
executor plugin asks for its configuration when Snakemake loads it (10 s each where the
controller is down), is not run at all (gpuflow.ops.snakemake_adapter.import_slurm_plugin_quickly).
How long status takes then is measured by benchmarks/status.py (about 3 s here), not here.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import BIN, workflow_env
from tests.test_status import SNAKEFILE, by_rule

DOWN = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A folder where the status workflow ran: quick and slow done, broken failed."""
    workdir = tmp_path_factory.mktemp("finished")
    config = workdir / "config.yaml"
    config.write_text("steps: 1\nstep_seconds: 0\n", encoding="utf-8")
    command = [str(BIN / "snakemake"), "--snakefile", str(SNAKEFILE), "--directory", str(workdir)]
    command += ["--configfile", str(config), "--cores", "2", "--keep-going"]
    subprocess.run(command, env=workflow_env(), capture_output=True, check=False, timeout=300)
    return workdir


def slurm_commands(folder: Path, squeue: str, sacct: str, scontrol: str) -> dict[str, str]:
    """The test environment with `squeue`, `sacct` and `scontrol` running the given shell
    lines, first on PATH; each call is noted in `folder`/calls.log."""
    folder.mkdir()
    for name, body in (("squeue", squeue), ("sacct", sacct), ("scontrol", scontrol)):
        note = f'echo "{name} $*" >> {folder / "calls.log"}'
        (folder / name).write_text(f"#!/bin/sh\nPATH=/usr/bin:/bin\n{note}\n{body}\n")
        (folder / name).chmod(0o755)
    env = workflow_env()
    env["PATH"] = f"{folder}:{env['PATH']}"
    return env


def status(workdir: Path, env: dict[str, str], *args: str) -> tuple[str, float]:
    """The output of `gpuflow status` in `workdir` and the seconds it took."""
    command = [str(BIN / "gpuflow"), "status", "--snakefile", str(SNAKEFILE)]
    command += ["--directory", str(workdir), "--configfile", str(workdir / "config.yaml")]
    started = time.monotonic()
    result = subprocess.run(
        [*command, *args], capture_output=True, text=True, env=env, check=False, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout, time.monotonic() - started


def calls(folder: Path) -> list[str]:
    """The SLURM commands run, by name."""
    log = folder / "calls.log"
    return [line.split()[0] for line in log.read_text().splitlines()] if log.exists() else []


def test_status_with_the_controller_down_waits_on_no_slurm_command_and_says_so(
    finished_run, tmp_path
):
    hang = f"sleep 60; echo '{DOWN}' >&2; exit 1"
    env = slurm_commands(tmp_path / "bin", squeue=hang, sacct=hang, scontrol=hang)
    table, seconds = status(finished_run, env)
    assert seconds < 60, "it waited a command out"
    assert calls(tmp_path / "bin") == ["squeue"], "squeue alone, given 2 s"
    assert (
        "SLURM controller unreachable (squeue: no answer in 2 s): SLURM jobs' states not read;"
        in table
    )
    out, _ = status(finished_run, env, "--json")
    report = json.loads(out)
    assert report["slurm_unreachable"] == "squeue: no answer in 2 s"
    rows = by_rule(report)
    assert (rows["quick"]["done"], rows["slow"]["done"], rows["broken"]["failed"]) == (1, 1, 1)
    [broken] = report["failed"]
    assert broken["last_line"] == "ValueError: made to fail on purpose"
    assert broken["slurm_id"] is None and not report["run_active"]


def test_status_reads_slurm_s_states_where_the_controller_answers(finished_run, tmp_path):
    line = f"7|gpuflow_run|rule_slow|RUNNING|{finished_run}|2026-11-24T03:56:00|Unknown"
    squeue = f'case "$*" in *--json*) exit 1;; *) echo "{line}";; esac'
    env = slurm_commands(tmp_path / "bin", squeue=squeue, sacct="exit 1", scontrol="exit 1")
    table, _ = status(finished_run, env)
    assert "unreachable" not in table
    report = json.loads(status(finished_run, env, "--json")[0])
    assert report["slurm_unreachable"] is None and report["run_active"]
    [slow] = report["running"]
    assert (slow["rule"], slow["slurm_id"], slow["slurm_state"]) == ("slow", "7", "RUNNING")
