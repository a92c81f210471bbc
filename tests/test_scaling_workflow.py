"""The scaling family end to end: the results of the session's finished run of every family
(`finished_all`, on `.test/all`), and the paper-scale SLURM plan."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml
from snakemake_executor_plugin_slurm.partitions import get_best_partition, read_partition_file
from snakemake_executor_plugin_slurm.submit_string import get_submit_command
from snakemake_executor_plugin_slurm.utils import set_gres_string

from tests.conftest import REPO
from tests.figures import assert_drawn_figure


@pytest.mark.workflow
def test_a_tiny_scaling_study_produces_every_output(finished_all: Path):
    out = finished_all / "results" / "scaling"
    summary = pd.read_csv(out / "comprehensive_summary.csv")
    ddp = summary[summary["method"] == "transformer-ddp"]
    assert sorted(zip(ddp["configuration"], ddp["world_size"], strict=True)) == [
        ("imdb", 1), ("imdb", 2), ("short", 1), ("short", 2),
    ]  # fmt: skip
    assert (ddp["global_batch_size"] == 16).all()
    assert sorted(ddp["per_gpu_batch_size"]) == [8, 8, 16, 16]
    two = ddp[ddp["world_size"] == 2]
    assert (two["comm_total_ms_per_step"] > 0).all() and (two["comm_probe_steps"] > 0).all()
    assert set(summary[summary["method"] != "transformer-ddp"]["configuration"]) == {
        "imdb",
        "short",
    }
    run = json.loads((out / "runs/short/nodes~1/world~2/run.json").read_text())
    assert run["backend"] == "gloo" and run["precision"] == "fp32"
    assert run["run_record"]["host"] and len(run["ranks"]) == 2
    assert len(pd.read_csv(out / "epochs.csv")) == 2 * (2 + 4)  # world sizes x imdb's + short's
    assert r"\toprule" in (out / "summary_table.tex").read_text()
    cost = pd.read_csv(out / "cost_table.csv")
    assert {"gpu_hours", "speedup_per_extra_gpu_hour"} <= set(cost.columns)
    report = (out / "performance_report.txt").read_text()
    assert "[imdb]" in report and "[short]" in report and "COMPARISON" in report
    for name in ("epoch_time", "speedup_efficiency", "throughput", "accuracy", "compute_comm"):
        assert_drawn_figure(out / "figures" / f"{name}.png")
    assert not list(out.glob("jobs/**/*.state.pt"))


def paper_plan(run_snakemake, tmp_path: Path) -> str:
    paper = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
    result = run_snakemake(
        tmp_path, {"families": ["scaling"], "scaling": paper["scaling"]}, "-n", "-p"
    )
    return result.stdout


def job_blocks(plan: str, rule: str) -> list[str]:
    return [b for b in plan.split("\n\n") if f"rule {rule}:" in b]


def resources_of(block: str) -> dict:
    line = next(x for x in block.splitlines() if x.strip().startswith("resources:"))
    pairs = [p.split("=", 1) for p in line.split("resources:", 1)[1].split(", ")]
    return {k.strip(): int(v) if v.isdigit() else v for k, v in pairs}


def sbatch_options(resources: dict) -> str:
    """The sbatch command line the SLURM executor plugin makes of a job's resources."""

    class Resources(dict):
        __getattr__ = dict.get

    job = SimpleNamespace(resources=Resources(resources), threads=1)
    params = {
        "run_uuid": "job", "slurm_logfile": "log", "comment_str": "c", "account": "",
        "partition": "", "workdir": "",
    }  # fmt: skip
    return get_submit_command(job, params) + set_gres_string(job)


@pytest.mark.workflow
def test_the_paper_plan_launches_torchrun_on_1_2_4_gpus_and_2_nodes(run_snakemake, tmp_path):
    plan = paper_plan(run_snakemake, tmp_path)
    single = job_blocks(plan, "scaling_train")
    assert len(single) == 9  # imdb, agnews, agnews_large x 1, 2, 4 GPUs
    for block in single:
        world = int(re.search(r"world=(\d+)", block).group(1))
        assert (
            f"python -m torch.distributed.run --standalone --nproc-per-node={world}"
            " --max-restarts=1 -m gpuflow "
            "scaling-train" in block
        )
        sbatch = sbatch_options(resources_of(block))
        assert f"--gpus={world}" in sbatch and "--cpus-per-gpu=8" in sbatch
        assert f"--mem {16000 * world}" in sbatch and "-t 240" in sbatch
        assert "--ntasks-per-gpu" not in sbatch and "--cpus-per-task" not in sbatch

    multi = job_blocks(plan, "scaling_train_multinode")
    assert len(multi) == 3
    for block in multi:
        assert "world=8" in block
        assert 'GPUFLOW_RENDEZVOUS="$endpoint" srun --nodes=2 --ntasks-per-node=1' in block
        assert (
            "python -m torch.distributed.run --nnodes=2 --nproc-per-node=4 --max-restarts=1"
            in block
        )
        assert "endpoint=$(python -m gpuflow.scaling.rendezvous 2> " in block
        assert '--rdzv-backend=c10d --rdzv-endpoint="$endpoint"' in block
        assert "29500" not in block, "no fixed port: each job finds its own"
        sbatch = sbatch_options(resources_of(block))
        for option in ("--nodes=2", "--ntasks=2", "--cpus-per-task=32", "--gres=gpu:4",
                       "--mem 64000"):  # fmt: skip
            assert option in sbatch, (option, sbatch)

    baseline = job_blocks(plan, "scaling_baseline")
    assert len(baseline) == 3
    sbatch = sbatch_options(resources_of(baseline[0]))
    assert "--cpus-per-task=16" in sbatch and "--gpus" not in sbatch
    assert resources_of(baseline[0])["slurm_partition"] == "genoa", "a partition of site.yaml"


@pytest.mark.workflow
def test_a_config_that_still_sets_the_rendezvous_port_runs_with_one_note(run_snakemake, tmp_path):
    """scaling.multinode.port is deprecated: accepted, ignored, and said so once per parse."""
    paper = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
    paper["scaling"]["multinode"]["port"] = 29511
    result = run_snakemake(
        tmp_path, {"families": ["scaling"], "scaling": paper["scaling"]}, "-n", "-p"
    )
    output = result.stdout + result.stderr
    notes = [line for line in output.splitlines() if "multinode.port" in line]
    assert notes == [
        "config key 'scaling.multinode.port' (29511) is ignored: each two-node job finds a free"
        " rendezvous port on its head node; remove the key"
    ]
    multi = job_blocks(result.stdout, "scaling_train_multinode")
    assert multi and all("29511" not in block for block in multi)


@pytest.mark.workflow
def test_every_paper_job_through_the_slurm_profile_gets_the_sites_stop_warning(
    run_snakemake, tmp_path: Path
):
    """profiles/slurm/site.yaml warns 10 minutes before the limit: every job's sbatch line asks
    for SIGUSR1 600 s before it, two-node training (4 GPUs per node) too, and the plugin
    puts that job on the GPU partition."""
    paper = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
    config = {"families": ["scaling"], "scaling": paper["scaling"]}
    profile = REPO / "profiles" / "slurm"
    plan = run_snakemake(tmp_path, config, "--profile", str(profile), "-n", "-p").stdout
    blocks = [b for b in plan.split("\n\n") if re.search(r"^\s*resources:", b, re.M)]
    rules = {re.search(r"rule (\w+):", b).group(1) for b in blocks}
    assert {"scaling_train", "scaling_train_multinode", "scaling_baseline"} <= rules, rules
    partitions = read_partition_file(profile / "site.yaml")
    for block in blocks:
        resources = resources_of(block)
        sbatch = sbatch_options(resources)
        assert "--signal=USR1@600" in sbatch, (block, sbatch)
        if "rule scaling_train_multinode:" in block:
            assert "--gres=gpu:4" in sbatch and "--gpus" not in sbatch, sbatch
            job = SimpleNamespace(resources=resources, threads=1, name="multinode")
            assert get_best_partition(partitions, job, logging.getLogger()) == "gpu_h100"
