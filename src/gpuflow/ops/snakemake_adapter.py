"""The one adapter to Snakemake: everything gpuflow uses beyond Snakemake's command line."""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any
from unittest import mock

from gpuflow.errors import GpuflowError

if TYPE_CHECKING:
    from gpuflow.slurm.fit import PlannedJob

SUPPORTED = ("9.27",)  # major.minor releases whose internals this module reads
DB_FILE = Path(".snakemake") / "metadata.db"  # where the db backend keeps its default database


def snakemake_version() -> str:
    """The installed Snakemake's version, read without importing it."""
    try:
        return version("snakemake")
    except PackageNotFoundError:
        return "none"


def check_version(found: str | None = None) -> None:
    """Stop with one line unless the installed Snakemake is a SUPPORTED release."""
    found = found or snakemake_version()
    if ".".join(found.split(".")[:2]) not in SUPPORTED:
        wanted = ", ".join(f"{release}.x" for release in SUPPORTED)
        raise GpuflowError(
            f"gpuflow's Snakemake adapter supports Snakemake {wanted}, found {found}: "
            f"install a supported one (pip install 'snakemake=={SUPPORTED[-1]}.*')"
        )


@dataclass
class DagJob:
    """One job of the DAG: rule, where it runs, its resources and files, and why it runs."""

    rule: str
    local: bool
    resources: dict[str, Any] = field(default_factory=dict)
    wildcards: dict[str, str] = field(default_factory=dict)
    why: str = "missing"
    benchmark: str | None = None
    output: list[str] = field(default_factory=list)
    input: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    params: str = ""  # params_digest of the job's params (what it computes, so what it costs)


@dataclass(frozen=True)
class Marker:
    """An output Snakemake marked incomplete: its job started and has not finished."""

    output: str
    started: float
    external_jobid: str | None


@dataclass
class Records:
    """Snakemake's persistence for the DAG's outputs, as one backend holds it."""

    backend: str
    markers: dict[str, Marker] = field(default_factory=dict)
    times: dict[str, tuple[float, float]] = field(default_factory=dict)
    ran_params: dict[str, str] = field(default_factory=dict)  # params_digest it ran with
    locked: bool = False


@dataclass
class Dag:
    """What Snakemake would do: its jobs, rule order, config, and how the executor submits."""

    jobs: list[DagJob]
    done: list[DagJob]  # finished jobs of the targets (none under every_job: all are in jobs)
    rule_order: list[str]
    config: dict[str, Any]
    array_rules: set[str]
    array_limit: int
    records: Records
    partition_config: str | None = None  # the SLURM profile's site file (partitions)


# What Snakemake's errors say when a file changed while it read the folder.
FILE_RACES = ("seems to be a broken symlink", "No such file or directory")


def snakemake_options(args: argparse.Namespace) -> list[str]:
    """The Snakemake options of a gpuflow command (profiles, backend, Snakefile, config files)."""
    argv = ["--directory", args.directory]
    for profile in args.profile:
        argv += ["--profile", profile]
    if getattr(args, "persistence_backend", None):
        argv += ["--persistence-backend", args.persistence_backend]
    if args.snakefile:
        argv += ["--snakefile", args.snakefile]
    if args.configfile:  # last: --configfile takes every word that follows
        argv += ["--configfile", *args.configfile]
    return argv


def unlock_command(args: argparse.Namespace, backend: str) -> str:
    """The `snakemake --unlock` that removes the lock a killed run left."""
    options = snakemake_options(args)
    if backend != "file" and not getattr(args, "persistence_backend", None):
        options = ["--persistence-backend", backend, *options]
    return shlex.join(["snakemake", "--unlock", *options])


def why_it_runs(reason: Any, incomplete: bool) -> str:
    """missing / incomplete / changed / downstream, from Snakemake's structured reason."""
    if incomplete and (reason.forced or reason.incomplete_output):
        return "incomplete"
    if reason.missing_output:
        return "missing"
    if reason.updated_input_run and not reason.updated_input - reason.updated_input_run:
        return "downstream"
    return "changed"


def read_records(persistence: Any, backend: str, jobs: list[Any]) -> Records:
    """Incomplete markers of every output, recorded times of each finished job, the lock."""
    records = Records(backend)
    keys = [str(f) for job in jobs for f in job.output]
    for key in persistence._filter_incomplete_keys(keys):
        jobid = next(iter(persistence._get_external_jobids([key])), None)
        started = persistence._get_recorded_starttime(key) or 0.0
        records.markers[key] = Marker(key, float(started), str(jobid) if jobid else None)
    for job in jobs:
        if not job.output or str(job.output[0]) in records.markers:
            continue
        record = persistence.metadata(job.output[0])
        if record is not None and record.starttime and record.endtime:
            records.times[str(job.output[0])] = (float(record.starttime), float(record.endtime))
        if record is not None and record.params is not None:
            records.ran_params[str(job.output[0])] = params_digest(
                record.params, job.wildcards_dict
            )
    records.locked = any(True for _ in persistence._read_locks())
    return records


def build_dag(args: argparse.Namespace, every_job: bool = False) -> Dag:
    """Build the DAG in-process through Snakemake's API, as `snakemake --dry-run` would."""
    check_version()
    import_slurm_plugin_quickly()
    from snakemake.api import SnakemakeApi
    from snakemake.cli import parse_args, parse_config
    from snakemake.settings.enums import PersistenceBackend
    from snakemake.settings.types import (
        ConfigSettings,
        DAGSettings,
        OutputSettings,
        ResourceSettings,
        WorkflowSettings,
    )
    from snakemake_interface_executor_plugins.registry import ExecutorPluginRegistry

    argv = [*args.targets, "--dry-run", "--rerun-incomplete", *snakemake_options(args)]
    cli = parse_args(argv)[1]
    executor = cli.executor or "local"
    executor_settings = ExecutorPluginRegistry().get_plugin(executor).get_settings(cli)
    backend = str(cli.persistence_backend.name).lower()  # named: gpuflow's option or a profile
    if backend == "file" and not getattr(args, "persistence_backend", None):
        backend = "db" if (Path(args.directory) / DB_FILE).exists() else "file"  # the folder's
    output = OutputSettings(dryrun=True, log_level_override=logging.WARNING)

    def read_once() -> Dag:
        # patch.dict: Snakemake's changes to the environment are undone when the block ends
        with mock.patch.dict(os.environ), SnakemakeApi(output) as api:
            workflow_api = api.workflow(
                resource_settings=ResourceSettings(
                    cores=cli.cores or 1,
                    nodes=cli.jobs,
                    resources=cli.resources,
                    default_resources=cli.default_resources,
                    overwrite_resources=cli.set_resources,
                    overwrite_threads=cli.set_threads,
                ),
                config_settings=ConfigSettings(
                    config=parse_config(cli.config), configfiles=cli.configfile
                ),
                workflow_settings=WorkflowSettings(
                    persistence_backend=PersistenceBackend.parse_choice(backend),
                    persistence_backend_db_url=cli.persistence_backend_db_url,
                ),
                snakefile=cli.snakefile,
                workdir=cli.directory,
            )
            dag_api = workflow_api.dag(
                DAGSettings(targets=set(cli.targets), force_incomplete=True, forceall=every_job)
            )
            dag_api.execute_workflow(
                executor=executor, pseudo_executor="dryrun", executor_settings=executor_settings
            )
            return read_dag(workflow_api._workflow, backend, executor_settings)

    try:
        try:
            return read_once()
        except Exception as error:
            # A run writing in the folder (`gpuflow status` during a run) changed a file between
            # two of Snakemake's looks (its "broken symlink" check, or the other way round).
            if not any(sign in str(error) for sign in FILE_RACES):
                raise
            return read_once()  # a live run wrote a file while Snakemake read it: read again
    except Exception as error:
        raise GpuflowError(f"Snakemake could not plan the run: {error}") from None


def profile_settings(profiles: list[str]) -> tuple[argparse.Namespace, Any]:
    """Snakemake's options as `profiles` set them, and their executor's settings."""
    check_version()
    import_slurm_plugin_quickly()
    from snakemake.cli import parse_args
    from snakemake_interface_executor_plugins.registry import ExecutorPluginRegistry

    cli = parse_args([arg for profile in profiles for arg in ("--profile", profile)])[1]
    executor = cli.executor or "local"
    return cli, ExecutorPluginRegistry().get_plugin(executor).get_settings(cli)


def import_slurm_plugin_quickly() -> None:
    """Import the SLURM executor plugin with SLURM's commands out of its reach."""
    if "snakemake_executor_plugin_slurm" in sys.modules:
        return
    which = shutil.which("which")
    with mock.patch.dict(os.environ), tempfile.TemporaryDirectory() as bare:
        if which:
            os.symlink(which, os.path.join(bare, "which"))
        os.environ["PATH"] = bare
        import snakemake_executor_plugin_slurm  # noqa: F401


def params_digest(params: list[Any], wildcards: dict[str, Any] | None = None) -> str:
    """A short digest of a job's params as Snakemake's persistence serialises them."""
    named = {repr(str(value)) for value in (wildcards or {}).values()}
    text = json.dumps([p for p in params if str(p) not in named], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def read_dag(workflow: Any, backend: str, executor_settings: Any) -> Dag:
    """The jobs of a built DAG, its finished ones, rule order, config, records, array rules."""
    dag = workflow.dag
    jobs = sorted(dag.needrun_jobs(exclude_finished=False), key=dag.jobid)
    done = sorted((job for job in dag.jobs if not dag.needrun(job)), key=dag.jobid)
    records = read_records(workflow.persistence, backend, jobs + done)
    # workflow.is_local() answers True for every rule under the dry-run executor;
    # `localrules:` and rules without a body (e.g. `all`) run on the submit node.
    local = {
        rule.name
        for rule in workflow.rules
        if rule.group is None and (rule.name in workflow._localrules or rule.norun)
    }
    arrays = str(getattr(executor_settings, "array_jobs", None) or "").replace(";", ",")
    partitions = getattr(executor_settings, "partition_config", None)

    def described(job: Any, **more: Any) -> DagJob:
        return DagJob(
            rule=job.rule.name,
            local=job.rule.name in local,
            wildcards={k: str(v) for k, v in job.wildcards_dict.items()},
            benchmark=str(job.benchmark) if job.benchmark else None,
            output=[str(f) for f in job.output],
            input=[str(f) for f in job.input],
            params=params_digest(workflow.persistence._params(job), job.wildcards_dict),
            **more,
        )

    return Dag(
        jobs=[
            described(
                job,
                resources=dict(job.resources.items()),
                why=why_it_runs(
                    dag.reason(job), any(str(f) in records.markers for f in job.output)
                ),
                log=[str(f) for f in job.log],
            )
            for job in jobs
        ],
        done=[described(job, why="done") for job in done],
        rule_order=[rule.name for rule in workflow.rules],
        config=dict(workflow.config),
        array_rules={rule.strip() for rule in arrays.split(",") if rule.strip()},
        array_limit=int(getattr(executor_settings, "array_limit", None) or 1000),
        records=records,
        partition_config=str(partitions) if partitions else None,
    )


def partition_config(workflow: Any) -> str | None:
    """The site file the running workflow's SLURM executor reads partitions from, or None."""
    return getattr(workflow.executor_settings, "partition_config", None)


def jobs_to_run(workflow: Any) -> list[tuple[PlannedJob, bool]]:
    """Each job the running workflow will run, as the SLURM plugin sees it, and whether local."""
    from gpuflow.slurm.fit import PlannedJob

    return [
        (
            PlannedJob(
                job.rule.name,
                dict(job.resources.items()),
                job.threads,
                {name: str(value) for name, value in job.wildcards_dict.items()},
            ),
            job.is_local,
        )
        for job in workflow.dag.needrun_jobs()
    ]


def snakemake_started(directory: str | Path) -> float | None:
    """When the oldest live Snakemake process working in `directory` on this host started."""
    import psutil

    here = os.path.realpath(directory)
    started = []
    for entry in Path("/proc").glob("[0-9]*"):
        if entry.name == str(os.getpid()):
            continue
        try:
            if os.readlink(entry / "cwd") != here:
                continue
            argv = (entry / "cmdline").read_bytes().split(b"\0")[:3]  # python -m snakemake
            if any(os.path.basename(arg).startswith(b"snakemake") for arg in argv):
                started.append(psutil.Process(int(entry.name)).create_time())
        except (OSError, psutil.Error):
            continue
    return min(started) if started else None


@dataclass
class FailedJob:
    """A job the latest run log reports as failed ("Error in rule ...")."""

    rule: str
    output: list[str]
    log: list[str] = field(default_factory=list)
    external_jobid: str | None = None
    message: str = ""


RAN_JOBS = ("Select jobs to execute", "Error in rule", "has been submitted with SLURM jobid")


def latest_run_log(directory: str | Path) -> Path | None:
    """The newest log of a run that ran jobs (dry runs, --unlock, --lint, --report skipped)."""
    folder = Path(directory) / ".snakemake" / "log"
    for path in sorted(folder.glob("*.snakemake.log"), reverse=True):
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        ran = any(mark in text for mark in RAN_JOBS)
        if ran and "This was a dry-run" not in text:
            return path
    return None


FIELD = re.compile(r"^    (message|output|log|external_jobid): (.*)$")


def failed_jobs(log: Path | None) -> list[FailedJob]:
    """The jobs a run log reports with "Error in rule <rule>:", in order, last report wins."""
    if log is None:
        return []
    failed: dict[tuple[str, ...], FailedJob] = {}
    current: FailedJob | None = None
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    for line in [*lines, ""]:  # the empty last line ends a report the log ends in
        start = re.match(r"^Error in rule (\S+):$", line)
        if start:
            current = FailedJob(rule=start[1], output=[])
            continue
        if current is None:
            continue
        match = FIELD.match(line)
        if match is None:
            if not line.startswith("    "):
                failed[tuple(current.output) or (current.rule,)] = current
                current = None
            continue
        key, value = match[1], match[2].strip()
        if key in ("output", "log"):  # a log's paths are followed by " (check log file(s) ...)"
            paths = value.split(" (check log file")[0].split(", ")
            setattr(current, key, [path.strip() for path in paths if path.strip()])
        elif key == "external_jobid":
            current.external_jobid = value
        else:
            current.message = "" if value == "None" else value
    return list(failed.values())
