"""Helpers shared by every family: targets, resources, config checks.

Parsing stays cheap (each cluster job re-parses the Snakefile): no torch, transformers or
pandas here; checks that need files use gpuflow.modelref, which imports neither.
"""

import json
import shlex

from gpuflow.config import check_files_exist
from gpuflow.modelref import check_model_reference

CONDA_ENV = "../../envs/gpuflow.yaml"

# Each family's .smk registers a function returning its final targets.
FAMILY_TARGETS = {}

# Checks of the files a config names (models, data folders), run by `onstart` in the Snakefile:
# after the DAG is built and before the first job of a real run. Dry runs and `gpuflow plan`
# skip them, so a cluster run can be planned on a machine that lacks the data.
STARTUP_CHECKS = []


def run_startup_checks():
    """Run every registered startup check; the first failure stops the run before any job."""
    for check in STARTUP_CHECKS:
        check()


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


# Fluency-toxicity family


def fluency_model():
    """The LM folder or cached id to score with: the user's, or the embedded one trained here."""
    return config["fluency"]["lm"]["path"] or "results/fluency/lm"


def fluency_embedded_lm():
    """The embedded LM folder as an input when the config trains one, else nothing.

    A user's model is a param, not an input, so a dry run works where the model is absent.
    """
    return [] if config["fluency"]["lm"]["path"] else ["results/fluency/lm"]


def fluency_texts_args():
    """Command-line arguments of `gpuflow fluency-texts` for the configured texts."""
    texts = config["fluency"]["texts"]
    if texts["source"] == "embedded":
        return (
            f"--n-texts {texts['n_texts']} --corpus {quoted(texts['corpus'])} "
            f"--max-words {texts['max_words']} --min-words {texts['min_words']} "
            f"--seed {texts['seed']} "
            + ("--shuffled-twins" if texts["shuffled_twins"] else "")
        )
    id_column = texts["id_column"]
    return (
        f"--files {quoted(texts['files'])} --text-column {shlex.quote(texts['text_column'])} "
        + (f"--id-column {shlex.quote(id_column)} " if id_column else "")
        + (
            f"--group-columns {quoted(texts['group_columns'])}"
            if texts["group_columns"]
            else ""
        )
    )


def fluency_group_columns():
    """Columns the fluency statistics are grouped by."""
    if config["fluency"]["texts"]["source"] == "embedded":
        return ["condition", "source"]
    return config["fluency"]["texts"]["group_columns"]


def fluency_targets():
    """Final targets of the fluency family."""
    return [
        "results/fluency/summary.md",
        "results/fluency/figures/logppl_vs_toxicity.png",
        "results/fluency/figures/binned_means.png",
        "results/fluency/figures/by_group.png",
    ]


# Seed sweep family


def sweep_shard_tables():
    """Every shard table of the configured sweep."""
    return expand(
        f"{SWEEP_DIR}/shards/{SWEEP_CELL}/shard~{{shard}}.csv",
        method=SWEEP["methods"],
        rank=SWEEP["teacher_ranks"],
        width=SWEEP["student_widths"],
        shard=range(SWEEP_N_SHARDS),
    )


def sweep_seed_range(wildcards):
    """START:STOP of the shard's seeds."""
    start = int(wildcards.shard) * SWEEP["shard_size"]
    return f"{start}:{min(start + SWEEP['shard_size'], SWEEP['n_seeds'])}"


def sweep_settings(wildcards):
    """Only what the method's results depend on, so other changes keep its shards."""
    return as_json({"data": SWEEP["data"], wildcards.method: SWEEP[wildcards.method]})


def sweep_targets():
    """Final targets of the sweep family."""
    return [
        f"{SWEEP_DIR}/summary.csv",
        f"{SWEEP_DIR}/figures/test_error.png",
        f"{SWEEP_DIR}/figures/guesses.png",
    ]
