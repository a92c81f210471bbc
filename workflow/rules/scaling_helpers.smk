"""Helpers of the DDP scaling family: settings, resources and run paths (its checks across
keys: gpuflow.scaling.checks, run with the schema's)."""

from gpuflow.scaling.results import train_results
from gpuflow.slurm.nccl import nccl_json

SCALING = config["scaling"]
SCALING_DIR = "results/scaling"
SCALING_RUN = SCALING["run"]
SCALING_WORLDS = sorted(SCALING["world_sizes"])
SCALING_MULTI = SCALING["multinode"]
# scaling.multinode.port is no longer read: each two-node job finds its rendezvous port free on
# its head node (gpuflow.scaling.rendezvous). A config that still sets it runs, with this note;
# the key is dropped, so no step gets it.
if "port" in SCALING_MULTI:
    logger.warning(
        f"config key 'scaling.multinode.port' ({SCALING_MULTI.pop('port')}) is ignored: each"
        " two-node job finds a free rendezvous port on its head node; remove the key"
    )
SCALING_TRAIN_RES = SCALING["resources"]["scaling_train"]
SCALING_ON_GPU = SCALING_TRAIN_RES["gpu"] > 0
# Cores per training process: the config's cpus_per_gpu on GPUs, cpus_per_task on CPU.
SCALING_TRAIN_CPUS = rule_cpus("scaling", "scaling_train")
# Every DDP training's NCCL settings: the SLURM site file's `nccl` block (gpuflow.slurm.nccl).
SCALING_NCCL = nccl_json(workflow.basedir)
SCALING_FIGURES = [
    "epoch_time",
    "speedup_efficiency",
    "throughput",
    "accuracy",
    "compute_comm",
]


def scaling_data_files(wildcards):
    """The user's data files that exist (missing ones are reported by the data step itself)."""
    data = SCALING["configurations"][wildcards.cfg]["data"]
    paths = [data["path"], data["val_path"]] if data["source"] != "embedded" else []
    return [p for p in paths if p and os.path.exists(p)]


def scaling_settings(name, part):
    """Results keys of `part` of configuration `name` (a dict of its blocks), as --settings."""
    return results_json("scaling", {"configurations": {name: part}})


def scaling_tokenize_settings(wildcards):
    """The tokenizer block and the model's max_seq_len: all the tokenize step uses."""
    chosen = SCALING["configurations"][wildcards.cfg]
    part = {
        "tokenizer": chosen["tokenizer"],
        "model": {"max_seq_len": chosen["model"]["max_seq_len"]},
    }
    return scaling_settings(wildcards.cfg, part)


def scaling_train_settings(wildcards):
    """The results keys one configuration's training depends on, as one JSON argument."""
    return results_json("scaling", train_results(SCALING, wildcards.cfg))


def scaling_train_resources():
    """One node: a GPU (or a CPU slot) per process, memory per process, same cores per CPU run.

    Every CPU run reserves the cores of the largest world size, so runs measured on one
    machine never share it with each other.
    """
    block = SCALING_TRAIN_RES
    mem_mb, runtime, cpus = block["mem_mb"], block["runtime"], SCALING_TRAIN_CPUS
    resources = {
        "mem_mb": retried(
            "mem_mb", SCALING_ON_GPU, lambda wildcards: mem_mb * int(wildcards.world)
        ),
        "runtime": time_limit("scaling_train", SCALING_ON_GPU, runtime),
        "runtime_settings": runtime_json("scaling"),
        # torchrun's --max-restarts, runtime-only: a resource, so no rerun trigger.
        "max_restarts": SCALING["max_restarts"],
        # the SLURM site file's NCCL settings, runtime-only: a resource, so no rerun trigger.
        "nccl": SCALING_NCCL,
    }
    if SCALING_ON_GPU:
        model = gpu_model(workflow.basedir)
        resources.update(
            gpu=lambda wildcards: int(wildcards.world),
            cpus_per_gpu=cpus,
            tasks_per_gpu=0,
            **({"gpu_model": model} if model else {}),
        )
    else:
        resources.update(gpu=0, cpus_per_task=cpus * max(SCALING_WORLDS))
    return resources


def scaling_train_threads(wildcards):
    if SCALING_ON_GPU:
        return SCALING_TRAIN_CPUS * int(wildcards.world)
    return SCALING_TRAIN_CPUS * max(SCALING_WORLDS)


def scaling_multinode_resources():
    """Several nodes: one srun task per node, each with its node's GPUs, CPUs and memory.

    The GPUs per node go as `gres` (sbatch --gres=gpu:N counts per node), not as slurm_extra:
    a rule's slurm_extra would replace the profile's, which carries the site's stop warning
    (--signal), and the plugin reads gres to pick a GPU partition. gpu_model "" keeps a site's
    model from adding --gpus=<model>:1.
    """
    block, per_node = SCALING_TRAIN_RES, SCALING_MULTI["gpus_per_node"]
    mem_mb, runtime = block["mem_mb"], block["runtime"]
    return {
        "nodes": SCALING_MULTI["nodes"],
        "tasks": SCALING_MULTI["nodes"],
        "mpi": "srun",
        "tasks_per_gpu": 0,
        "cpus_per_task": SCALING_TRAIN_CPUS * per_node,
        "gres": f"gpu:{per_node}",
        "gpu_model": "",
        "mem_mb": retried("mem_mb", True, mem_mb * per_node),
        "runtime": time_limit("scaling_train_multinode", True, runtime),
        "runtime_settings": runtime_json("scaling"),
        # torchrun's --max-restarts, runtime-only: a resource, so no rerun trigger.
        "max_restarts": SCALING["max_restarts"],
        # the SLURM site file's NCCL settings, runtime-only: a resource, so no rerun trigger.
        "nccl": SCALING_NCCL,
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
