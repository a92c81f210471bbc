"""Checks of a SLURM run before its first job: the site file, and jobs an earlier run left.

Parsing stays cheap (the Snakefile calls these at start-up): no torch or pandas here.
"""

from __future__ import annotations

import getpass
import os
import shutil
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuflow.errors import ConfigError, GpuflowError

JOB_NAME_PREFIX = "gpuflow_"


def default_account() -> str | None:
    """The user's default account in SLURM's database, or None where there is none."""
    if shutil.which("sacctmgr") is None:
        return None
    command = ["sacctmgr", "--noheader", "--parsable2", "show", "user", getpass.getuser()]
    try:
        result = subprocess.run(
            [*command, "format=DefaultAccount"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = result.stdout.split() if result.returncode == 0 else []
    return lines[0] if lines else None


def named_partitions(config: Any, key: str = "") -> Iterator[tuple[str, str]]:
    """(dotted key, partition) of every `slurm_partition` the config sets."""
    if isinstance(config, dict):
        for name, value in config.items():
            dotted = f"{key}.{name}" if key else str(name)
            if name == "slurm_partition" and value:
                yield dotted, str(value)
            else:
                yield from named_partitions(value, dotted)


def read_site(site_file: str | Path) -> dict[str, Any]:
    """The site file's values (profiles/slurm/site.yaml or GPUFLOW_SLURM_SITE)."""
    with open(site_file, encoding="utf-8") as handle:
        return yaml.safe_load(handle) or {}


def warning_signal(site: dict[str, Any]) -> str | None:
    """sbatch's option for the site's stop warning: SIGUSR1 `stop_warning_minutes` before a
    job's time limit, to every process of its step; None where the site wants none."""
    minutes = site.get("stop_warning_minutes")
    return f"--signal=USR1@{int(minutes) * 60}" if minutes else None


def check_partitions(config: dict[str, Any], site_file: str | Path) -> None:
    """Raise ConfigError when the config names a partition the site file does not have."""
    site = read_site(site_file)
    known = sorted(site.get("partitions") or {})
    for key, partition in named_partitions(config):
        if partition not in known:
            raise ConfigError(
                key,
                f"partition '{partition}' is not in the site file {site_file}",
                f"one of {known}",
            )


@dataclass(frozen=True)
class SlurmJob:
    """A job of an earlier run, as squeue lists it."""

    job_id: str
    comment: str
    state: str


def earlier_jobs(workdir: str | Path) -> list[SlurmJob]:
    """Pending or running jobs of this user that a gpuflow run submitted from `workdir`."""
    if shutil.which("squeue") is None:
        return []
    command = ["squeue", "--me", "--noheader", "--format=%i|%j|%k|%T|%Z"]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if result.returncode != 0:
        return []
    here = os.path.realpath(workdir)
    jobs = []
    for line in result.stdout.splitlines():
        fields = line.split("|")
        if len(fields) != 5:
            continue
        job_id, name, comment, state, directory = fields
        if name.startswith(JOB_NAME_PREFIX) and os.path.realpath(directory) == here:
            jobs.append(SlurmJob(job_id, comment, state))
    return jobs


def job_comment(rule: str, wildcard_values: Iterable[str]) -> str:
    """The comment the SLURM executor plugin gives a job of `rule` (rule_<rule>_wildcards_...)."""
    values = "_".join(str(v) for v in wildcard_values).replace("/", "_")
    return f"rule_{rule}_wildcards_{values}" if values else f"rule_{rule}"


def check_no_earlier_jobs(planned: Iterable[tuple[str, Iterable[str]]], workdir: str) -> None:
    """Refuse to submit a job that an earlier run's SLURM job is still running or queued for.

    `planned` holds (rule, wildcard values) of every job this run would submit.
    """
    running = {job.comment: job for job in earlier_jobs(workdir)}
    clashes = [
        running[comment]
        for comment in {job_comment(rule, values) for rule, values in planned}
        if comment in running
    ]
    if clashes:
        clashes.sort(key=lambda job: job.job_id)
        listed = ", ".join(f"{job.job_id} ({job.comment}, {job.state})" for job in clashes)
        ids = " ".join(job.job_id for job in clashes)
        raise GpuflowError(
            f"{len(clashes)} SLURM job(s) of an earlier run still write targets of this run: "
            f"{listed}. Wait for them (squeue --me) or end them with: scancel {ids}"
        )
