"""The two-node scaling rule on two SLURM nodes, on CPU with gloo, through the SLURM profile.

The test cluster's partition 'multi' is two slurmd nodes, each in a network namespace of its own
with its own address and hostname (tests/slurm/nodes.py). The real workflow's
scaling_train_multinode job gets both; its srun starts one torchrun per node, which meet through
c10d rendezvous on the first node, and train the tiny configuration with one process each. The
same configuration trained by one process on the same global batch gives the same validation
loss and accuracy (the tolerance of tests/test_scaling_ddp.py: one validation sample of 32).
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from tests.conftest import snakemake, tiny_config
from tests.slurm import harness, nodes

pytestmark = [pytest.mark.slurm, pytest.mark.workflow]
pytest_plugins = ["tests.slurm.fixtures"]

MULTI = "results/scaling/runs/short/nodes~2/world~2/run.json"
SINGLE = "results/scaling/runs/short/nodes~1/world~1/run.json"
TOKENS = "results/scaling/data/short/train.npz"


def two_node_config() -> dict[str, Any]:
    """The tiny scaling family with its two-node run: two nodes, one process each."""
    config = tiny_config("slurm")
    config["families"] = ["scaling"]
    config["scaling"]["multinode"] = {"enabled": True, "nodes": 2, "gpus_per_node": 1}
    return config


@pytest.fixture(scope="module")
def runs(slurm_cluster, tmp_path_factory) -> dict[str, Any]:
    """Both runs through the profile: the two-node job on partition 'multi', one process on
    the host's node. The data they read is made locally first (tests/test_slurm_workflow.py
    runs those rules as SLURM jobs), so the profile run submits the two trainings alone."""
    workdir = tmp_path_factory.mktemp("two-nodes")
    snakemake(workdir, two_node_config(), TOKENS)
    result, _ = harness.run_profile(
        workdir,
        harness.REPO / "Snakefile",
        two_node_config(),
        MULTI,
        SINGLE,
        "--set-resources",
        "scaling_train_multinode:slurm_partition=multi",
        timeout=600,
    )
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-8000:]}"
    multi, single = (json.loads((workdir / path).read_text()) for path in (MULTI, SINGLE))
    return {"workdir": workdir, "multi": multi, "single": single}


def test_one_torchrun_per_node_joined_into_one_run(runs):
    multi = runs["multi"]
    assert (multi["world_size"], multi["nodes"], multi["processes_per_node"]) == (2, 2, 1)
    assert multi["backend"] == "gloo" and multi["ddp"]["wrapped"]
    assert sorted(rank["host"] for rank in multi["ranks"]) == sorted(nodes.MULTI)


def test_slurm_gave_the_job_both_nodes(runs):
    job_id = runs["multi"]["run_record"]["slurm_job_id"]
    command = ["sacct", "-X", "--noheader", "--parsable2", f"--jobs={job_id}"]
    listed = subprocess.run(
        [*command, "--format=Partition,NNodes,NodeList,State"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert listed == ["multi|2|gfnode[1-2]|COMPLETED"]


def test_two_nodes_validate_as_one_process_on_the_same_global_batch(runs):
    """Validation loss and accuracy (the same validation set): the training loss is a mean of
    micro-batch means, which depends on how the global batch is split (measured: 0.6984 on two
    nodes, 0.7008 in one process, while the validation losses differ by 1e-5)."""
    multi, single = runs["multi"], runs["single"]
    assert multi["global_batch_size"] == single["global_batch_size"] == 16
    assert (multi["per_gpu_batch_size"], single["per_gpu_batch_size"]) == (8, 16)
    assert len(multi["epochs"]) == len(single["epochs"]) == 2
    for a, b in zip(single["epochs"], multi["epochs"], strict=True):
        assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-4)
        assert a["val_accuracy"] == pytest.approx(b["val_accuracy"], abs=1 / 32 + 1e-9)
