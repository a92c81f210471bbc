"""Helpers shared by every family: targets, resources, config checks.

Parsing stays cheap (each cluster job re-parses the Snakefile): no torch, transformers or
pandas here; checks that need files use gpuflow.modelref, which imports neither.
"""

import json
import os
import shlex

from gpuflow.config import check_files_exist
from gpuflow.modelref import check_model_reference
from gpuflow.stopping import ignore_warning

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

# Inside a SLURM job, Snakemake ignores SLURM's stop warning (SIGUSR1, the profile's --signal),
# which would end it: the gpuflow step it runs inherits that and installs its own handler.
if "SLURM_JOB_ID" in os.environ:
    ignore_warning()


def run_startup_checks():
    """Run every registered startup check; the first failure stops the run before any job."""
    for check in STARTUP_CHECKS:
        check()
    check_slurm_run()


def check_slurm_run():
    """On SLURM: every partition the config names is in the site file in use, and no job of
    this run is still running or queued from an earlier run (a killed submitter's orphans).
    """
    from gpuflow.slurm_site import check_no_earlier_jobs, check_partitions

    site_file = getattr(workflow.executor_settings, "partition_config", None)
    if site_file:
        check_partitions(config, site_file)
    planned = (
        (job.rule.name, list(job.wildcards)) for job in workflow.dag.needrun_jobs()
    )
    check_no_earlier_jobs(planned, os.getcwd())


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


def fluency_model_param(wildcards, input):
    """The model `gpuflow perplexity` loads: the embedded LM input, or the configured model."""
    return input.embedded_lm or config["fluency"]["lm"]["path"]


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


# DDP scaling family


def scaling_check():
    """Stop before any job when the configurations cannot run as asked."""
    missing = [n for n in SCALING_RUN if n not in SCALING["configurations"]]
    if missing:
        raise WorkflowError(
            f"config key 'scaling.run': {missing} not in scaling.configurations "
            f"(known: {sorted(SCALING['configurations'])})"
        )
    if SCALING_TRAIN_RES["gpu"] > 1:
        raise WorkflowError(
            "config key 'scaling.resources.scaling_train.gpu': one GPU per process "
            f"(expected 0 or 1, got {SCALING_TRAIN_RES['gpu']})"
        )
    if SCALING_MULTI["enabled"] and not SCALING_ON_GPU:
        raise WorkflowError(
            "config key 'scaling.multinode.enabled': multi-node runs need GPUs "
            "(set scaling.resources.scaling_train.gpu: 1)"
        )
    worlds = SCALING_WORLDS + (
        [SCALING_MULTI["nodes"] * SCALING_MULTI["gpus_per_node"]]
        if SCALING_MULTI["enabled"]
        else []
    )
    for name in SCALING_RUN:
        settings = SCALING["configurations"][name]
        key = f"scaling.configurations.{name}"
        model, train = settings["model"], settings["train"]
        if model["d_model"] % model["n_heads"]:
            raise WorkflowError(
                f"config key '{key}.model.d_model': {model['d_model']} is not divisible "
                f"by n_heads {model['n_heads']}"
            )
        if SCALING["warmup_epochs"] >= train["epochs"]:
            raise WorkflowError(
                f"config key 'scaling.warmup_epochs': {SCALING['warmup_epochs']} leaves no "
                f"measured epoch of {name}'s {train['epochs']}"
            )
        if (train["global_batch_size"] is None) == (
            train["per_gpu_batch_size"] is None
        ):
            raise WorkflowError(
                f"config key '{key}.train': set exactly one of global_batch_size, "
                "per_gpu_batch_size"
            )
        split = train["accumulation_steps"]
        for world in worlds:
            if train["global_batch_size"] and train["global_batch_size"] % (
                world * split
            ):
                raise WorkflowError(
                    f"config key '{key}.train.global_batch_size': {train['global_batch_size']} "
                    f"does not split over world size {world} x {split} accumulation steps"
                )
        if settings["data"]["source"] != "embedded" and not settings["data"]["path"]:
            raise WorkflowError(
                f"config key '{key}.data.path': required for source "
                f"'{settings['data']['source']}'"
            )


def scaling_data_files(wildcards):
    """The user's data files that exist (missing ones are reported by the data step itself)."""
    data = SCALING["configurations"][wildcards.cfg]["data"]
    paths = [data["path"], data["val_path"]] if data["source"] != "embedded" else []
    return [p for p in paths if p and os.path.exists(p)]


def scaling_train_settings(wildcards):
    """Everything the training step needs to know, as one JSON argument."""
    settings = SCALING["configurations"][wildcards.cfg]
    return as_json(
        {
            "device": SCALING["device"],
            "amp": SCALING["amp"],
            "warmup_epochs": SCALING["warmup_epochs"],
            "cpu_threads_per_process": SCALING["cpu_threads_per_process"],
            "ddp": SCALING["ddp"],
            "model": settings["model"],
            "train": settings["train"],
        }
    )


def scaling_train_resources():
    """One node: a GPU (or a CPU slot) per process, memory per process, same cores per CPU run.

    Every CPU run reserves the cores of the largest world size, so runs measured on one
    machine never share it with each other.
    """
    block = SCALING_TRAIN_RES
    mem_mb, runtime, cpus = block["mem_mb"], block["runtime"], block["cpus_per_task"]
    resources = {
        "mem_mb": lambda wildcards, attempt: mem_mb * int(wildcards.world) * attempt,
        "runtime": lambda wildcards, attempt: runtime * attempt,
    }
    if SCALING_ON_GPU:
        resources.update(
            gpu=lambda wildcards: int(wildcards.world),
            cpus_per_gpu=cpus,
            tasks_per_gpu=0,
        )
    else:
        resources.update(gpu=0, cpus_per_task=cpus * max(SCALING_WORLDS))
    return resources


def scaling_train_threads(wildcards):
    if SCALING_ON_GPU:
        return SCALING_TRAIN_RES["cpus_per_task"] * int(wildcards.world)
    return SCALING_TRAIN_RES["cpus_per_task"] * max(SCALING_WORLDS)


def scaling_multinode_resources():
    """Several nodes: one srun task per node, each with its node's GPUs, CPUs and memory."""
    block, per_node = SCALING_TRAIN_RES, SCALING_MULTI["gpus_per_node"]
    mem_mb, runtime = block["mem_mb"], block["runtime"]
    return {
        "nodes": SCALING_MULTI["nodes"],
        "tasks": SCALING_MULTI["nodes"],
        "mpi": "srun",
        "tasks_per_gpu": 0,
        "cpus_per_task": block["cpus_per_task"] * per_node,
        "slurm_extra": f"--gpus-per-node={per_node}",
        "mem_mb": lambda wildcards, attempt: mem_mb * per_node * attempt,
        "runtime": lambda wildcards, attempt: runtime * attempt,
    }


def scaling_runs():
    """Run records of every configuration, world size and (when enabled) the multi-node run."""
    runs = [
        f"{SCALING_DIR}/runs/{name}/nodes~1/world~{world}/run.json"
        for name in SCALING_RUN
        for world in SCALING_WORLDS
    ]
    if SCALING_MULTI["enabled"]:
        nodes, per_node = SCALING_MULTI["nodes"], SCALING_MULTI["gpus_per_node"]
        runs += [
            f"{SCALING_DIR}/runs/{name}/nodes~{nodes}/world~{nodes * per_node}/run.json"
            for name in SCALING_RUN
        ]
    return runs


def scaling_targets():
    return [
        f"{SCALING_DIR}/comprehensive_summary.csv",
        f"{SCALING_DIR}/summary_table.tex",
        f"{SCALING_DIR}/cost_table.csv",
        f"{SCALING_DIR}/performance_report.txt",
        *[f"{SCALING_DIR}/figures/{name}.png" for name in SCALING_FIGURES],
    ]


# SSVAE family


def check_ssvae_data():
    """Stop a real run before any job when the configured MNIST IDX folder is incomplete."""
    from gpuflow.ssvae.data import find_idx_files

    find_idx_files(config["ssvae"]["data"]["path"])


def ssvae_m2_metrics():
    return expand(
        SSVAE_M2,
        frac=SSVAE_GRID["fractions"],
        corrupt=SSVAE_GRID["corruption_rates"],
        alpha=SSVAE_GRID["alphas"],
        seed=SSVAE_GRID["seeds"],
    )


def ssvae_baseline_metrics():
    return expand(
        SSVAE_BASELINE,
        frac=SSVAE_GRID["fractions"],
        corrupt=SSVAE_GRID["corruption_rates"],
        seed=SSVAE_GRID["seeds"],
    )


def ssvae_settings():
    train = {k: v for k, v in SSVAE["train"].items() if k != "stack"}
    return as_json({**SSVAE["model"], **train})


def ssvae_data_args():
    data = SSVAE["data"]
    if data["source"] == "idx":
        return f"--source idx --path {shlex.quote(data['path'])}"
    return (
        f"--source embedded --test-fraction {data['test_fraction']}"
        f" --split-seed {data['split_seed']}"
    )


def ssvae_idx_files(wildcards):
    """The IDX files that exist (so a changed file re-runs the data job). Missing ones are left
    out: dry runs plan without the data, and the data job names what is missing."""
    data = SSVAE["data"]
    if data["source"] != "idx":
        return []
    names = (
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
    )
    folders = (data["path"], os.path.join(data["path"], "MNIST", "raw"))
    found = []
    for name in names:
        candidates = [os.path.join(f, name + s) for f in folders for s in ("", ".gz")]
        found += [c for c in candidates if os.path.isfile(c)][:1]
    return found


def ssvae_targets():
    return [
        f"{SSVAE_DIR}/summary.md",
        f"{SSVAE_DIR}/figures/accuracy_vs_fraction.png",
        f"{SSVAE_DIR}/figures/alpha_fraction_heatmap.png",
        f"{SSVAE_DIR}/figures/corruption_effect.png",
        f"{SSVAE_DIR}/figures/m2_vs_baseline.png",
    ]
