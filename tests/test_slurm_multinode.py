"""Two-node trainings on the test cluster, on CPU with gloo, through the SLURM profile.

The test cluster's partition 'multi' is two slurmd nodes, each in a network namespace of its own
with its own address and hostname (tests/slurm/nodes.py). A scaling_train_multinode job gets
both; its srun starts one torchrun per node, which meet through c10d rendezvous on the first
node, and train the tiny configuration with one process each.

- Two such jobs at once (configurations `short` and `other`) both get both nodes, so both heads
  are the same node. Each finds its own rendezvous port free there (gpuflow.scaling.rendezvous):
  a fixed port made the second job's torchrun meet the first's. Both finish, with the numbers of
  the same two jobs run one at a time (`--jobs 1`, `--forcerun`), and every rank on both nodes
  records the site file's `nccl` block.
- The two nodes' run validates as one process on the same global batch does (`short` in one
  process on the host's node, run beside the two; the tolerance of tests/test_scaling_ddp.py:
  one validation sample of 32).
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import snakemake, tiny_config
from tests.slurm import harness, nodes

pytestmark = [pytest.mark.slurm, pytest.mark.workflow]
pytest_plugins = ["tests.slurm.fixtures"]

CONFIGS = ("short", "other")
RUNS = {name: f"results/scaling/runs/{name}/nodes~2/world~2/run.json" for name in CONFIGS}
LOGS = {name: f"results/scaling/logs/train/{name}/nodes~2/world~2.log" for name in CONFIGS}
SINGLE = "results/scaling/runs/short/nodes~1/world~1/run.json"
TOKENS = [f"results/scaling/data/{name}/train.npz" for name in CONFIGS]
NCCL = {"NCCL_SOCKET_IFNAME": "eth0", "NCCL_DEBUG": "WARN"}
RENDEZVOUS = re.compile(r"^gpuflow rendezvous: (\S+):(\d+) ", re.MULTILINE)


def two_jobs_config() -> dict[str, Any]:
    """The tiny scaling family with two configurations (different seeds, so different numbers)
    and their two-node runs: two nodes, one process each."""
    config = tiny_config("slurm")
    config["families"] = ["scaling"]
    scaling = config["scaling"]
    other = copy.deepcopy(scaling["configurations"]["short"])
    other["train"]["seed"] = 7
    scaling["configurations"]["other"] = other
    scaling["run"] = list(CONFIGS)
    scaling["multinode"] = {"enabled": True, "nodes": 2, "gpus_per_node": 1}
    return config


def site_with_nccl(folder: Path) -> Path:
    """The test cluster's site file with an `nccl` block."""
    site = yaml.safe_load(harness.TEST_SITE.read_text())
    site["nccl"] = NCCL
    path = folder / "site.yaml"
    path.write_text(yaml.safe_dump(site))
    return path


def multinode_jobs(run_id: str) -> dict[str, dict[str, str]]:
    """sacct's record of the run's two-node jobs, by configuration."""
    fields = "JobIDRaw,Comment,State,Partition,NNodes,NodeList,Start,End"
    rows = [
        dict(zip(fields.split(","), row, strict=True)) for row in harness.sacct_jobs(run_id, fields)
    ]
    return {  # comment: rule_scaling_train_multinode_wildcards_<cfg>_<world>
        row["Comment"].split("_wildcards_")[1].rsplit("_", 1)[0]: row
        for row in rows
        if row["Comment"].startswith("rule_scaling_train_multinode")
    }


def cancel_jobs_of(workdir: Path) -> None:
    """scancel whatever this folder's runs left queued or running (a run that timed out)."""
    left = [
        job["id"]
        for job in harness.workdir_jobs(workdir)
        if job["state"] in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING")
    ]
    if left:
        subprocess.run(["scancel", *left], check=False)


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def collected(workdir: Path, result) -> dict[str, Any]:
    """What one run left: its two-node run records, logs and SLURM's record of those jobs."""
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-8000:]}"
    return {
        "records": {name: read_json(workdir / RUNS[name]) for name in CONFIGS},
        "logs": {name: (workdir / LOGS[name]).read_text() for name in CONFIGS},
        "jobs": multinode_jobs(harness.run_id(result.stderr)),
    }


@pytest.fixture(scope="module")
def runs(slurm_cluster, tmp_path_factory) -> dict[str, Any]:
    """The two jobs at once (and the one-process run on the host's node), then the same two
    one at a time (in the same folder, forced), through the profile on partition 'multi'. Their
    data is made locally first (tests/test_slurm_workflow.py runs those rules as SLURM jobs)."""
    workdir = tmp_path_factory.mktemp("two-multinode-jobs")
    env = {"GPUFLOW_SLURM_SITE": str(site_with_nccl(workdir))}
    snakemake(workdir, two_jobs_config(), *TOKENS)
    partition = ("--set-resources", "scaling_train_multinode:slurm_partition=multi")
    targets = list(RUNS.values())
    try:
        at_once, _ = harness.run_profile(
            workdir, harness.REPO / "Snakefile", two_jobs_config(), *targets, SINGLE,
            *partition, env=env, timeout=600,
        )  # fmt: skip
        together = collected(workdir, at_once)
        single = read_json(workdir / SINGLE)
        one_by_one, _ = harness.run_profile(
            workdir, harness.REPO / "Snakefile", two_jobs_config(), *targets, *partition,
            "--jobs", "1", "--forcerun", "scaling_train_multinode", env=env, timeout=600,
        )  # fmt: skip
        alone = collected(workdir, one_by_one)
    finally:
        cancel_jobs_of(workdir)
    for name in CONFIGS:
        [line] = [x for x in together["logs"][name].splitlines() if x.startswith("gpuflow rend")]
        job = together["jobs"][name]
        span = f"{job['Start']} to {job['End']}"
        print(f"{name}: SLURM job {job['JobIDRaw']} {job['State']} on {job['NodeList']}, {span}")
        print(f"{name}: {line}")
    return {"together": together, "alone": alone, "single": single}


def endpoint(log: str) -> tuple[str, int]:
    [(head, port)] = RENDEZVOUS.findall(log)
    return head, int(port)


def seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def test_one_torchrun_per_node_joined_into_one_run(runs):
    for name, record in runs["together"]["records"].items():
        assert (record["world_size"], record["nodes"], record["processes_per_node"]) == (2, 2, 1)
        assert record["backend"] == "gloo" and record["ddp"]["wrapped"], name
        assert sorted(rank["host"] for rank in record["ranks"]) == sorted(nodes.MULTI), name


def test_both_jobs_ran_at_once_on_the_same_nodes_and_finished(runs):
    jobs = runs["together"]["jobs"]
    assert sorted(jobs) == sorted(CONFIGS)
    for name, job in jobs.items():
        assert runs["together"]["records"][name]["run_record"]["slurm_job_id"] == job["JobIDRaw"]
        where = (job["Partition"], job["NNodes"], job["NodeList"], job["State"])
        assert where == ("multi", "2", "gfnode[1-2]", "COMPLETED"), name
    first, second = jobs.values()
    assert seconds(first["Start"]) < seconds(second["End"])
    assert seconds(second["Start"]) < seconds(first["End"]), "they ran at the same time"


def test_their_heads_were_one_node_and_their_ports_differ(runs):
    """The rendezvous each job found (its log) is the one its ranks met at (run.json). With one
    port for both, both still finished here (the second's agents joined the first's store,
    their keys kept apart by the run id): only the ports tell the collision."""
    found = {name: endpoint(runs["together"]["logs"][name]) for name in CONFIGS}
    assert {head for head, _ in found.values()} == {nodes.MULTI[0]}
    assert found["short"][1] != found["other"][1], found
    for name, (head, port) in found.items():
        met = runs["together"]["records"][name]["rendezvous"]["endpoint"]
        assert met == f"{head}:{port}", (name, met)


def test_each_finished_as_it_does_run_alone(runs):
    """Every epoch's losses and accuracy equal those of the same job run one at a time (the
    two configurations' own numbers differ: their seeds do)."""
    keys = ("train_loss", "val_loss", "val_accuracy")
    numbers = {
        when: {
            name: [[epoch[key] for key in keys] for epoch in record["epochs"]]
            for name, record in runs[when]["records"].items()
        }
        for when in ("together", "alone")
    }
    assert numbers["together"]["short"] != numbers["together"]["other"]
    for name in CONFIGS:
        for at_once, alone in zip(numbers["together"][name], numbers["alone"][name], strict=True):
            assert at_once == pytest.approx(alone, rel=1e-6), name
    assert all(len(epochs) == 2 for epochs in numbers["together"].values())


def test_every_rank_on_both_nodes_had_the_site_nccl_settings(runs):
    for name, record in runs["together"]["records"].items():
        assert record["nccl"] == dict(sorted(NCCL.items())), name
        ranks = record["ranks"]
        assert sorted(rank["host"] for rank in ranks) == sorted(nodes.MULTI)
        assert [rank["nccl"] for rank in ranks] == [record["nccl"]] * 2, name


def test_two_nodes_validate_as_one_process_on_the_same_global_batch(runs):
    """Validation loss and accuracy (the same validation set): the training loss is a mean of
    micro-batch means, which depends on how the global batch is split (measured: 0.6984 on two
    nodes, 0.7008 in one process, while the validation losses differ by 1e-5)."""
    multi, single = runs["together"]["records"]["short"], runs["single"]
    assert multi["global_batch_size"] == single["global_batch_size"] == 16
    assert (multi["per_gpu_batch_size"], single["per_gpu_batch_size"]) == (8, 16)
    assert len(multi["epochs"]) == len(single["epochs"]) == 2
    for a, b in zip(single["epochs"], multi["epochs"], strict=True):
        assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-4)
        assert a["val_accuracy"] == pytest.approx(b["val_accuracy"], abs=1 / 32 + 1e-9)
