"""A slice of the real workflow through `snakemake --profile profiles/slurm` on the live cluster.

One GPU rule of every family (fluency_perplexity, ssvae_train, scaling_train, sweep_shard) runs
with `gpu: 1` on the test cluster's fake GPUs (CPU torch), the rules they need as CPU jobs or
local rules. SLURM's own records (scontrol) and the devices each job wrote into its outputs
show where and how it ran; its numbers must equal those of a local run of the same config.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from tests.conftest import snakemake, tiny_config
from tests.slurm import cluster, harness

pytestmark = [pytest.mark.slurm, pytest.mark.workflow]
pytest_plugins = ["tests.slurm.fixtures"]

SNAKEFILE = harness.REPO / "Snakefile"
FAKE_GPUS = {str(i) for i in range(cluster.N_GPUS)}

PERPLEXITY = "results/fluency/perplexity/shard~0.csv"
SSVAE = "results/ssvae/frac~0.2/corrupt~0.0/alpha~10/seed~0/metrics.json"
SCALING = "results/scaling/runs/short/nodes~1/world~1/run.json"
SWEEP = [f"results/sweep/shards/method~gd/rank~2/width~4/shard~{i}.csv" for i in (0, 1)]
TARGETS = [PERPLEXITY, SSVAE, SCALING, *SWEEP]

SLICE = tiny_config("slurm")
# Each GPU rule asks for its own memory and CPUs per GPU, so SLURM's records tell them apart.
GPU_RULES = ("fluency_perplexity", "ssvae_train", "scaling_train", "sweep_shard")
GPU_RESOURCES = {rule: SLICE[rule.split("_")[0]]["resources"][rule] for rule in GPU_RULES}
CPU_RULES = ("fluency_texts", "scaling_data", "scaling_tokenize")
CPU = SLICE["fluency"]["resources"]["fluency_texts"]
LOCAL_RULES = ("fluency_split", "ssvae_data")


def slice_config(lm: Path) -> dict[str, Any]:
    """Every family, tiny; the fluency LM is a random GPT-2 folder, so none is trained."""
    config = tiny_config("slurm")
    config["fluency"]["lm"] = {"path": str(lm)}
    return config


def random_gpt2(folder: Path) -> Path:
    """A randomly initialised 1-layer GPT-2 and a byte-level BPE tokenizer, save_pretrained."""
    from gpuflow.data.embedded import load_movie_reviews
    from gpuflow.fluency.train_lm import save_untrained_lm

    corpus = load_movie_reviews("imdb")["text"].iloc[:200].tolist()
    return save_untrained_lm(
        folder / "lm", corpus, 300, n_positions=64, n_embd=32, n_layer=1, n_head=2
    )


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> dict[str, Any]:
    return slice_config(random_gpt2(tmp_path_factory.mktemp("random-gpt2")))


@pytest.fixture(scope="module")
def runs(slurm_cluster, config, tmp_path_factory) -> dict[str, Path]:
    """The slice through the SLURM profile (GPU rules as 1-GPU jobs)
    and, at the same time, with Snakemake's local scheduler (no SLURM, no GPUs)."""
    workdirs = {name: tmp_path_factory.mktemp(f"{name}-workflow") for name in ("slurm", "local")}
    with ThreadPoolExecutor(max_workers=1) as pool:
        local = pool.submit(snakemake, workdirs["local"], config, *TARGETS)
        result, _ = harness.run_profile(workdirs["slurm"], SNAKEFILE, config, *TARGETS)
        local.result()
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-8000:]}"
    return workdirs


@pytest.fixture(scope="module")
def cluster_run(runs) -> Path:
    return runs["slurm"]


@pytest.fixture(scope="module")
def local_run(runs) -> Path:
    return runs["local"]


def run_records(workdir: Path) -> dict[str, dict[str, Any]]:
    """Each GPU rule's record of where it ran (gpuflow.job.devices.run_record), as it wrote it."""

    def read(path: str) -> dict[str, Any]:
        return json.loads((workdir / path).read_text())

    return {
        "fluency_perplexity": read(PERPLEXITY.replace(".csv", ".run.json")),
        "ssvae_train": read(SSVAE)["run_record"],
        "scaling_train": read(SCALING)["run_record"],
        **{f"sweep_shard~{i}": read(p.replace(".csv", ".run.json")) for i, p in enumerate(SWEEP)},
    }


def submitted_jobs(workdir: Path) -> dict[str, list[str]]:
    """SLURM job ids per rule of the run in `workdir`, from SLURM's queue records (comment
    field); jobs of other test modules (the memory test's ssvae_train) are not this run's."""
    rules = (*GPU_RESOURCES, *CPU_RULES, *LOCAL_RULES)
    jobs: dict[str, list[str]] = {}
    for job in harness.workdir_jobs(workdir):
        rule = next((r for r in rules if job["comment"].startswith(f"rule_{r}")), None)
        if rule:
            jobs.setdefault(rule, []).append(job["id"])
    return jobs


def test_every_gpu_job_records_its_slurm_job_and_one_fake_gpu(cluster_run, local_run):
    for name, record in run_records(cluster_run).items():
        assert record["slurm_job_id"], name
        assert record["cuda_visible_devices"] in FAKE_GPUS, (name, record)
        assert record["devices"] == ["cpu"], f"{name}: CPU torch runs the GPU rule on the CPU"
    for name, record in run_records(local_run).items():
        assert record["slurm_job_id"] is None, f"{name}: the local run ran outside SLURM"


def test_every_gpu_job_on_the_cluster_recorded_its_telemetry(cluster_run):
    for name, record in run_records(cluster_run).items():
        telemetry, wanted = record["telemetry"], GPU_RESOURCES[name.split("~")[0]]
        cpu = telemetry["cpu"]
        assert cpu["cpu_seconds"] > 0 and cpu["peak_rss_mb"] > 50, (name, cpu)
        # the job's allotment (SLURM_CPUS_ON_NODE), capped by the cores the node really has
        cores = min(len(os.sched_getaffinity(0)), wanted["cpus_per_gpu"])
        assert cpu["allotted_cores"] == cores, (name, cpu)
        # the fake GPUs are device files without a driver: NVML says why there is no GPU part
        assert telemetry["gpu"]["absent"].startswith("NVML init failed"), (name, telemetry)


def test_gpu_jobs_were_submitted_with_one_gpu_their_cpus_per_gpu_and_memory(cluster_run):
    for name, record in run_records(cluster_run).items():
        wanted = GPU_RESOURCES[name.split("~")[0]]
        job = harness.slurm_job(record["slurm_job_id"])
        assert job["JobState"] == "COMPLETED", name
        assert job["Partition"] == "gpu", name
        assert job["TresPerJob"] == f"gres:gpu:{cluster.GPU_TYPE}:1", name
        assert job["CpusPerTres"] == f"gres:gpu:{wanted['cpus_per_gpu']}", name
        # the plugin adds 1 MB to array jobs for their payload
        assert job["MinMemoryNode"] in (f"{wanted['mem_mb']}M", f"{wanted['mem_mb'] + 1}M"), name
        assert job["TimeLimit"] == f"00:{wanted['runtime']:02d}:00", name


def test_gpu_jobs_that_ran_at_the_same_time_saw_distinct_gpus(cluster_run):
    spans = []
    for name, record in run_records(cluster_run).items():
        job = harness.slurm_job(record["slurm_job_id"])
        spans.append((name, job["StartTime"], job["EndTime"], record["cuda_visible_devices"]))
    # SLURM's times are ISO 8601 to the second: compared as strings, they sort in time order
    overlapping = [
        (a, b) for i, a in enumerate(spans) for b in spans[i + 1 :] if a[1] < b[2] and b[1] < a[2]
    ]
    assert overlapping, f"no two GPU jobs ran at once: {spans}"
    for a, b in overlapping:
        assert a[3] != b[3], (a, b)


def test_sweep_shards_ran_as_jobs_of_their_own_not_as_an_array(cluster_run):
    """Arrays stay off (profiles/slurm): a failing array task deletes other tasks' outputs."""
    records = [r for name, r in run_records(cluster_run).items() if name.startswith("sweep")]
    jobs = [harness.slurm_job(r["slurm_job_id"]) for r in records]
    assert len({job["JobId"] for job in jobs}) == 2
    assert not any("ArrayJobId" in job for job in jobs)


def test_cpu_rules_ran_as_cpu_jobs_without_a_gpu_and_local_rules_were_not_submitted(cluster_run):
    jobs = submitted_jobs(cluster_run)
    for rule in CPU_RULES:
        assert len(jobs.get(rule, [])) == 1, (rule, jobs)
        job = harness.slurm_job(jobs[rule][0])
        assert job["JobState"] == "COMPLETED", rule
        assert job["Partition"] == "cpu", rule
        # no GPU request at all, though the test site names a gpu_model (GPU rules only ask it)
        assert job.get("TresPerJob", "(null)") in ("(null)", ""), rule
        assert job["MinMemoryNode"] == f"{CPU['mem_mb']}M", rule
    assert not set(LOCAL_RULES) & set(jobs)


def test_fluency_perplexities_equal_a_local_run(cluster_run, local_run):
    on_cluster = pd.read_csv(cluster_run / PERPLEXITY)
    local = pd.read_csv(local_run / PERPLEXITY)
    assert len(on_cluster) == 16  # 8 texts and their shuffled twins
    pd.testing.assert_frame_equal(on_cluster, local, check_exact=False, rtol=1e-6)


def test_ssvae_metrics_equal_a_local_run(cluster_run, local_run):
    on_cluster = json.loads((cluster_run / SSVAE).read_text())
    local = json.loads((local_run / SSVAE).read_text())
    assert on_cluster["test_accuracy"] == local["test_accuracy"]
    assert on_cluster["test_elbo"] == pytest.approx(local["test_elbo"], rel=1e-6)
    assert on_cluster["curve"] == local["curve"]


def test_scaling_losses_and_accuracy_equal_a_local_run(cluster_run, local_run):
    keys = ("epoch", "train_loss", "val_loss", "val_accuracy")
    on_cluster = json.loads((cluster_run / SCALING).read_text())["epochs"]
    local = json.loads((local_run / SCALING).read_text())["epochs"]
    assert len(on_cluster) == 2
    for mine, theirs in zip(on_cluster, local, strict=True):
        assert {k: mine[k] for k in keys} == pytest.approx({k: theirs[k] for k in keys}, rel=1e-6)


def test_sweep_rows_equal_a_local_run_except_wall_time(cluster_run, local_run):
    for shard in SWEEP:
        on_cluster = pd.read_csv(cluster_run / shard).drop(columns="wall_s")
        local = pd.read_csv(local_run / shard).drop(columns="wall_s")
        assert len(on_cluster) == 1
        pd.testing.assert_frame_equal(on_cluster, local)
