"""Helpers shared by every family: targets, resources, config checks.

Parsing stays cheap (each cluster job re-parses the Snakefile): no torch, transformers or
pandas here; checks that need files use gpuflow.modelref, which imports neither.
"""

import json
import shlex

from gpuflow.modelref import check_model_reference

CONDA_ENV = "../../envs/gpuflow.yaml"

# Each family's .smk registers a function returning its final targets.
FAMILY_TARGETS = {}


def all_targets(wildcards):
    """Final targets of every family that config['families'] enables."""
    missing = [f for f in config["families"] if f not in FAMILY_TARGETS]
    if missing:
        raise WorkflowError(f"config key 'families': no rules for {missing}")
    return [t for family in config["families"] for t in FAMILY_TARGETS[family]()]


def rule_resources(family, rule_name):
    """Resources of a rule from config[family]['resources'][rule_name].

    Memory and runtime grow with each retry (attempt 1, 2, ...), so a job killed for memory or
    time comes back with more. On GPU rules `cpus_per_task` counts per GPU: SLURM gets
    --gpus=N --cpus-per-gpu=C and no --ntasks-per-gpu (tasks_per_gpu: 0). GPU rules' shell
    commands start with `GPUFLOW_GPUS={resources.gpu}` (device locks in whole-node mode).
    """
    block = config[family]["resources"][rule_name]
    mem_mb, runtime = block["mem_mb"], block["runtime"]
    cpus = (
        {"cpus_per_gpu": block["cpus_per_task"], "tasks_per_gpu": 0}
        if block["gpu"]
        else {"cpus_per_task": block["cpus_per_task"]}
    )
    return {
        "gpu": block["gpu"],
        **cpus,
        "mem_mb": lambda wildcards, attempt: mem_mb * attempt,
        "runtime": lambda wildcards, attempt: runtime * attempt,
    }


def as_json(value):
    """A config value as a shell-quoted JSON argument."""
    return shlex.quote(json.dumps(value, sort_keys=True))


def quoted(values):
    """Shell-quoted, space-separated values (paths, names)."""
    return " ".join(shlex.quote(str(v)) for v in values)
