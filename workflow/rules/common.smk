"""Helpers shared by every family: targets, resources, config checks.

Parsing stays cheap (each cluster job re-parses the Snakefile): no torch, transformers or
pandas here; checks that need files use gpuflow.data.modelref, which imports neither.
"""

import json
import os
import shlex
import sys
from pathlib import Path

from snakemake.logging import logger

from gpuflow.settings.validate import check_files_exist, schema_families
from gpuflow.errors import GpuflowError
from gpuflow.job.finished_states import RECORDS_ENV, clean, records_folder
from gpuflow.data.modelref import check_model_reference
from gpuflow.settings.blocks import split_json
from gpuflow.settings.resources import cpus_of
from gpuflow.job.stopping import ignore_warning
from gpuflow.cost.limits import AUTO, auto_runtime
from gpuflow.cost.records import rate_records
from gpuflow.slurm.fit import grown, retry_limits
from gpuflow.slurm.site import gpu_model, site_path

CONDA_ENV = "../../envs/gpuflow.yaml"

# Each family's .smk registers a function returning its final targets.
FAMILY_TARGETS = {}

# Checks of the files a config names (models, data folders), run by `onstart` in the Snakefile:
# after the DAG is built and before the first job of a real run. Dry runs and `gpuflow plan`
# skip them, so a cluster run can be planned on a machine that lacks the data.
STARTUP_CHECKS = []


def check_results_folder():
    """Stop with one line when results/ exists but is not a folder (Snakemake would crash)."""
    if os.path.lexists("results") and not os.path.isdir("results"):
        raise WorkflowError(
            "results: not a folder (expected the folder every output goes to;"
            " move the file away)"
        )


check_results_folder()

# The job's own settings (config `telemetry`) travel in every step's --runtime JSON (the
# sampling interval: never a param, so changing it re-runs nothing) and in the report rules'
# --settings (the flag threshold changes only what reports say). Workflows with a config
# schema of their own (the SLURM tests') pass none: their jobs get the schema's defaults.
JOB_SETTINGS = config.get("telemetry", {})

# Steps keep their resume states past their outputs until the run has accepted those (a SLURM
# job can still time out after writing them, and its retry then resumes); see
# gpuflow.job.finished_states. Jobs re-parse this file in the same folder and record there.
os.environ[RECORDS_ENV] = str(records_folder("."))


def clean_finished_states():
    """At the end of a run (`onsuccess`, `onerror`): drop the kept states of finished jobs."""
    removed = clean(os.environ[RECORDS_ENV])
    if removed:
        logger.info(f"removed {len(removed)} resume state(s) of finished jobs")


# Inside a SLURM job, Snakemake ignores SLURM's stop warning (SIGUSR1, the profile's --signal),
# which would end it: the gpuflow step it runs inherits that and installs its own handler. Each
# job step's Snakemake runs under gpuflow.job.forward, which hands SLURM's signals on to the
# step (under proctrack/cgroup they reach only the job step's first process).
if "SLURM_JOB_ID" in os.environ:
    from snakemake_executor_plugin_gpuflow_slurm import forward_step_signals

    ignore_warning()
    forward_step_signals()


def run_startup_checks():
    """Run every registered startup check; the first failure stops the run before any job,
    in one line (Snakemake would print an exception with its traceback)."""
    try:
        for check in STARTUP_CHECKS:
            check()
        check_slurm_run()
    except GpuflowError as error:
        logger.error(str(error))
        sys.exit(1)


def check_slurm_run():
    """On SLURM: every partition the config names is in the site file in use, every job fits
    one of its partitions, and no job of this run is still running or queued from an earlier
    run (a killed submitter's orphans).
    """
    from gpuflow.ops.snakemake_adapter import jobs_to_run, partition_config
    from gpuflow.slurm.earlier_jobs import check_no_earlier_jobs
    from gpuflow.slurm.fit import check_jobs_fit
    from gpuflow.slurm.site import check_partitions

    site_file = partition_config(workflow)
    jobs = jobs_to_run(workflow)
    if site_file:
        check_partitions(config, site_file)
        check_jobs_fit((job for job, local in jobs if not local), site_file)
    to_run = ((job.name, list(job.wildcards.values())) for job, _ in jobs)
    check_no_earlier_jobs(to_run, os.getcwd())


def all_targets(wildcards):
    """Final targets of every family that config['families'] enables."""
    missing = [f for f in config["families"] if f not in FAMILY_TARGETS]
    if missing:
        raise WorkflowError(f"config key 'families': no rules for {missing}")
    return [t for family in config["families"] for t in FAMILY_TARGETS[family]()]


def final_outputs(*rules_):
    """Every output file of the given rules (a family's final targets), wildcards expanded."""
    return [path for rule_ in rules_ for path in rule_.output]


def rule_cpus(family, rule_name):
    """A rule's cores from config[family]['resources'][rule_name]: `cpus_per_gpu` on a GPU rule,
    `cpus_per_task` on a CPU rule (gpuflow.settings.resources; the other kind's key alone is a
    ConfigError naming it)."""
    block = config[family]["resources"][rule_name]
    return cpus_of(block, f"{family}.resources.{rule_name}")


def rule_resources(family, rule_name):
    """Resources of a rule from config[family]['resources'][rule_name].

    Memory and runtime grow with each retry (attempt 1, 2, ...), so a job killed for memory or
    time comes back with more (`retried`). A GPU rule's cores are its `cpus_per_gpu`: SLURM gets
    --gpus=N --cpus-per-gpu=C and no --ntasks-per-gpu (tasks_per_gpu: 0), and the SLURM site
    file's `gpu_model` where it names one; a CPU rule's are its `cpus_per_task`
    (--cpus-per-task), and it asks for no GPU and no GPU model at all. GPU rules' shell
    commands start with `GPUFLOW_GPUS={resources.gpu}` (device locks in whole-node mode).
    """
    block = config[family]["resources"][rule_name]
    mem_mb, runtime = block["mem_mb"], block["runtime"]
    cpus = (
        {"cpus_per_gpu": rule_cpus(family, rule_name), "tasks_per_gpu": 0}
        if block["gpu"]
        else {"cpus_per_task": rule_cpus(family, rule_name)}
    )
    model = gpu_model(workflow.basedir) if block["gpu"] else None
    return {
        "gpu": block["gpu"],
        **({"gpu_model": model} if model else {}),
        **cpus,
        "mem_mb": retried("mem_mb", block["gpu"] > 0, mem_mb),
        "runtime": time_limit(rule_name, block["gpu"] > 0, runtime),
        **(
            {"runtime_settings": runtime_json(family)}
            if family in schema_families()
            else {}
        ),
    }


def time_limit(rule_name, gpu, runtime):
    """The runtime resource of a rule: `runtime` minutes, or `auto`: each job's limit from its
    predicted time at the rates of the workflow's benchmarks/records ($GPUFLOW_RECORDS) for the
    site's GPU model or this CPU (gpuflow.cost.limits); either grows with each retry."""
    if runtime != AUTO:
        return retried("runtime", gpu, runtime)
    records = rate_records(workflow.basedir)
    site = site_path(workflow.basedir)

    def predicted(wildcards):
        return auto_runtime(rule_name, config, dict(wildcards), gpu, records, site)

    return retried("runtime", gpu, predicted)


def retried(resource, gpu, first):
    """A resource that grows with each retry: `first` (a number, or a function of the wildcards)
    x the attempt, up to the largest limit of the SLURM site's partitions for a GPU or CPU
    rule (gpuflow.slurm.fit.grown); without a site file, with no cap."""
    site = Path(site_path(workflow.basedir))
    limit = retry_limits(site, gpu).get(resource) if site.is_file() else None
    base = first if callable(first) else (lambda wildcards: first)
    return lambda wildcards, attempt: grown(base(wildcards), attempt, limit)


def as_json(value):
    """A config value as a shell-quoted JSON argument."""
    return shlex.quote(json.dumps(value, sort_keys=True))


def quoted(values):
    """Shell-quoted, space-separated values (paths, names)."""
    return " ".join(shlex.quote(str(v)) for v in values)


def results_json(family, values, job_settings=False):
    """The results-affecting keys of `values` (a part of config[family]), shell-quoted JSON.

    Passed as a rule's `params`, so changing one re-runs exactly the jobs that use it. With
    `job_settings` (report rules only) it holds the job's results keys too (`telemetry`).
    """
    job = JOB_SETTINGS if job_settings else None
    return shlex.quote(split_json(family, values, "results", job))


def runtime_json(family):
    """Every runtime-only key of config[family] (resources aside) and of the job's own
    settings (`telemetry` part), shell-quoted JSON.

    It travels as the string resource `runtime_settings` (`--runtime
    {resources.runtime_settings}`): resources are no rerun trigger (params, input, code,
    software-env and mtime are), so changing a runtime key re-runs nothing. Executors pass only
    integer resources on; each cluster job re-parses the Snakefile with the same config and
    gets the same string. Compact JSON keeps dry-run listings (`gpuflow plan`) readable. By
    hand, pass the same JSON to `--runtime`.
    """
    values = {k: v for k, v in config[family].items() if k != "resources"}
    return shlex.quote(split_json(family, values, "runtime", JOB_SETTINGS))


def job_json(kind):
    """The job's own `kind` keys (config `telemetry`) alone, shell-quoted JSON: `--runtime` of a
    rule that takes no family settings (a resource, as runtime_json), `--settings` of a report.
    """
    return shlex.quote(split_json("telemetry", {}, kind, JOB_SETTINGS))
