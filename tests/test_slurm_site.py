"""SLURM start-up checks: partitions the config names exist in the site file, every job fits one
of them, and a run refuses to submit what an earlier run's SLURM jobs are still working on (a
killed submitter's orphans)."""

from __future__ import annotations

import getpass
import json
import socket
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from snakemake_executor_plugin_slurm.utils import get_job_wildcards

from gpuflow.errors import ConfigError, GpuflowError
from gpuflow.ops.doctor import site_lines as doctor_site_lines
from gpuflow.settings.validate import load_config
from gpuflow.slurm.earlier_jobs import check_no_earlier_jobs, earlier_jobs
from gpuflow.slurm.fit import PlannedJob, check_jobs_fit, grown, retry_limits
from gpuflow.slurm.queue import job_comment
from gpuflow.slurm.site import check_partitions
from gpuflow.slurm.site_check import Cluster, Node, gpu_types, minutes, mismatches, unchecked
from tests.conftest import BIN, tiny_config, workflow_env
from tests.slurm import cluster, harness

REPO = harness.REPO
SITE = REPO / "profiles" / "slurm" / "site.yaml"


def test_every_partition_of_the_paper_config_is_in_the_example_site_file():
    check_partitions(load_config(REPO / "config" / "paper.yaml"), SITE)


def test_a_partition_the_site_file_lacks_names_the_key_and_the_known_partitions():
    config = {"scaling": {"baseline": {"slurm_partition": "main"}}}
    with pytest.raises(ConfigError) as error:
        check_partitions(config, SITE)
    message = str(error.value)
    assert "scaling.baseline.slurm_partition" in message
    assert "'main' is not in the site file" in message
    assert "genoa" in message and "gpu_h100" in message


def test_jobs_that_fit_no_partition_are_named_with_what_they_ask_and_each_limit_they_exceed():
    gpu = {"cpus_per_gpu": 8, "mem_mb": 16000, "runtime": 240}
    jobs = [
        PlannedJob("scaling_train", {"gpu": 1, **gpu}, 1, {"world": "1"}),
        PlannedJob("scaling_train", {"gpu": 8, **gpu}, 1, {"world": "8"}),
        PlannedJob("scaling_train", {"gpu": 16, **gpu}, 1, {"world": "16"}),
        PlannedJob("two_nodes", {"nodes": 3, "gres": "gpu:4", "mem_mb": 1000}, 1),
        PlannedJob("stats", {"cpus_per_task": 2, "mem_mb": 800000, "runtime": 9000}, 2),
        PlannedJob("tokenize", {"cpus_per_task": 4, "mem_mb": 16000, "runtime": 60}, 4),
    ]
    with pytest.raises(GpuflowError) as error:
        check_jobs_fit(jobs, SITE)
    assert str(error.value).splitlines() == [
        f"3 rule(s) ask for more than any partition of {SITE} gives:",
        "  scaling_train (world=8) asks gpu 8, cpus_per_gpu 8, mem_mb 16000, runtime 240; "
        "gpu_h100: max_gpu 4; genoa: max_gpu 0",
        "  two_nodes asks gpu 4, mem_mb 1000, nodes 3; gpu_h100: max_nodes 2; genoa: max_gpu 0",
        "  stats asks cpus_per_task 2, mem_mb 800000, runtime 9000; "
        "gpu_h100: max_mem_mb 720000, max_runtime 7200; genoa: max_mem_mb 336000, max_runtime 7200",
        "The SLURM plugin would send these jobs to the cluster's default partition. Lower the "
        "rule's resources in the config, or add a partition that has them to the site file.",
    ]
    check_jobs_fit([jobs[0], jobs[-1]], SITE)


def test_retries_grow_up_to_the_largest_partition_of_their_kind_and_never_below_the_first():
    assert retry_limits(SITE, gpu=True) == {"mem_mb": 720000, "runtime": 7200}
    assert retry_limits(SITE, gpu=False) == {"mem_mb": 336000, "runtime": 7200}
    assert [grown(3000, attempt, 7200) for attempt in (1, 2, 3)] == [3000, 6000, 7200]
    assert grown(9000, 2, 7200) == 9000, "a first attempt past the limit is the fit check's"
    assert grown(3000, 3, None) == 9000


@pytest.mark.parametrize("values", [["0.1", "0.0", "10", "3"], ["gd", "8", "8", "0"], []])
def test_job_comments_are_the_ones_the_slurm_plugin_gives_its_jobs(values):
    plugin_values = get_job_wildcards(SimpleNamespace(wildcards=values))
    expected = f"rule_r_wildcards_{plugin_values}" if plugin_values else "rule_r"
    assert job_comment("r", values) == expected


@pytest.mark.slurm
def test_a_job_an_earlier_run_left_running_blocks_its_target_and_names_the_scancel(
    slurm_cluster, tmp_path
):
    comment = job_comment("sweep_shard", ["gd", "8", "8", "1"])
    submitted = subprocess.run(
        ["sbatch", "--parsable", "--job-name=gpuflow_earlier-run", f"--comment={comment}",
         f"--chdir={tmp_path}", "--partition=cpu", "--mem=100", "--wrap=sleep 120"],
        capture_output=True, text=True, check=True, env=harness.cluster_env(),
    )  # fmt: skip
    job_id = submitted.stdout.strip().split(";")[0]
    try:
        assert [job.job_id for job in earlier_jobs(tmp_path)] == [job_id]
        assert earlier_jobs(REPO) == [], "jobs of other folders are not this run's"
        check_no_earlier_jobs([("sweep_shard", ["gd", "8", "8", "0"])], str(tmp_path))
        with pytest.raises(GpuflowError) as error:
            check_no_earlier_jobs(
                [("sweep_shard", ["gd", "8", "8", "0"]), ("sweep_shard", ["gd", "8", "8", "1"])],
                str(tmp_path),
            )
        assert f"scancel {job_id}" in str(error.value)
        assert comment in str(error.value)
    finally:
        subprocess.run(["scancel", job_id], check=False)


@pytest.mark.workflow
def test_a_run_refuses_in_one_line_while_an_earlier_runs_job_works_on_its_target(tmp_path):
    """A stand-in for squeue lists job 77 of an earlier run, running sweep_aggregate
    here: the run stops before any job with the refusal alone, no traceback after it."""
    fake = tmp_path / "bin" / "squeue"
    fake.parent.mkdir()
    line = f"77|gpuflow_earlier|rule_sweep_aggregate|RUNNING|{tmp_path}|2026-11-24T03:58:39|NONE"
    fake.write_text(f'#!/bin/sh\ncase "$*" in *--json*) exit 1;; esac\necho "{line}"\n')
    fake.chmod(0o755)
    config = tmp_path / "test-config.yaml"
    config.write_text(yaml.safe_dump(tiny_config("sweep")), encoding="utf-8")
    env = workflow_env()
    env["PATH"] = f"{fake.parent}:{env['PATH']}"
    result = subprocess.run(
        [str(BIN / "snakemake"), "--snakefile", str(REPO / "Snakefile"), "--cores", "1",
         "--directory", str(tmp_path), "--configfile", str(config)],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-3000:]
    after_stats = result.stderr.split("\ntotal ")[-1].splitlines()[1:]
    assert [line for line in after_stats if line.strip()] == [
        "1 SLURM job(s) of an earlier run still write targets of this run: 77 "
        "(rule_sweep_aggregate, RUNNING). Wait for them (squeue --me) or end them with: scancel 77"
    ]
    assert not (tmp_path / "results").exists()
    assert not list(Path(tmp_path, ".snakemake", "locks").glob("*")), "the next run may start"


@pytest.mark.slurm
def test_a_run_with_a_job_that_fits_no_partition_stops_before_submitting_any(
    slurm_cluster, tmp_path
):
    """The plugin itself would send the shards to the default partition ('cpu'), where sbatch
    fails with "Requested node configuration is not available", three times a job."""
    config = tiny_config("sweep")
    config["sweep"]["resources"] = {
        "sweep_shard": {"gpu": 5, "cpus_per_gpu": 1, "mem_mb": 2000, "runtime": 30}
    }
    result, _ = harness.run_profile(tmp_path, REPO / "Snakefile", config)
    assert result.returncode == 1, result.stderr[-3000:]
    unfit = [line for line in result.stderr.splitlines() if " asks " in line]
    assert unfit, result.stderr[-3000:]
    assert unfit[0].startswith("  sweep_shard (")
    assert unfit[0].endswith(
        "asks gpu 5, cpus_per_gpu 1, mem_mb 2000, runtime 30; gpu: max_gpu 4; cpu: max_gpu 0"
    )
    assert len(unfit) == 1, "the other rules fit"
    assert harness.workdir_jobs(tmp_path) == [], "nothing was submitted"
    assert not (tmp_path / "results").exists()


def a_cluster() -> Cluster:
    """Partition gpu (one node: 4 GPUs of type h100, 720 GB, 5 days) and cpu (two nodes of
    336 GB, no time limit), as scontrol has them; user alice may use account prj1."""
    nodes = [Node("g1", {"gpu"}, 720000, "gpu:h100:4(S:0-1)")]
    nodes += [Node(f"c{i}", {"cpu"}, 336000, "(null)") for i in (1, 2)]
    return Cluster({"gpu": "5-00:00:00", "cpu": "UNLIMITED"}, nodes, {"prj1"})


def test_the_site_check_reads_scontrol_s_limits_and_gres_as_slurm_writes_them():
    assert [minutes(t) for t in ("10:00:00", "2-00:00:00", "30:00", "1-12", "UNLIMITED")] == [
        600, 2880, 30, 2160, float("inf"),
    ]  # fmt: skip
    assert gpu_types("gpu:a100:4(S:0-1),gpu:v100:2,tmpspace:100G") == {"a100", "v100"}
    assert gpu_types("gpu:4") == set() and gpu_types("(null)") == set()


def test_the_site_check_names_each_value_the_cluster_does_not_have_in_one_line(monkeypatch):
    """The example site file (Snellius-like) against a cluster that has its partitions, and a
    site file wrong in each way the check knows: partition, GPU type, time, memory, account."""
    monkeypatch.setattr("getpass.getuser", lambda: "alice")
    site = yaml.safe_load(SITE.read_text())
    site["partitions"] = {
        "gpu": site["partitions"].pop("gpu_h100"),
        "cpu": site["partitions"]["genoa"],
    }
    site |= {"account": "prj1", "gpu_model": "h100"}
    assert mismatches(site, a_cluster()) == []
    site["partitions"]["gpu"] |= {"max_runtime": 8000, "available_gpu_models": ["h100", "a100"]}
    site["partitions"]["cpu"] |= {"max_mem_mb": 400000, "max_runtime": 10**6}
    site["partitions"]["gpu_a100"] = {"max_gpu": 4}
    site |= {"gpu_model": "a100", "account": "prj2"}
    assert mismatches(site, a_cluster()) == [
        "partitions.gpu.max_runtime: 8000 minutes, above the partition's MaxTime of 7200 minutes "
        "(5-00:00:00)",
        "partitions.gpu.available_gpu_models: a100 is on no node of the partition (its GPUs: "
        "gpu:h100:4(S:0-1))",
        "partitions.cpu.max_mem_mb: 400000, above the memory of the partition's largest node, "
        "336000 MB (c1: RealMemory)",
        "partitions.gpu_a100: no such partition on the cluster (it has cpu, gpu)",
        "gpu_model: a100 is on no node of GPU partition gpu (its GPUs: gpu:h100:4(S:0-1)): sbatch "
        "refuses its GPU jobs",
        "account: 'prj2' is not one of user alice's accounts in SLURM's database (sacctmgr show "
        "assoc: prj1)",
    ]


def test_the_site_check_says_the_account_is_unchecked_where_slurm_keeps_no_accounts():
    cluster = a_cluster()
    cluster.accounts, cluster.accounting_error = None, "sacctmgr: accounting storage is disabled"
    site = {"account": "prj2", "partitions": {}}
    assert mismatches(site, cluster) == []
    assert unchecked(site, cluster) == [
        "account: not checked (sacctmgr: accounting storage is disabled)"
    ]


def test_doctor_never_says_the_site_file_matches_a_cluster_it_could_not_ask():
    why = "not checked against a cluster: scontrol show partition: Unable to contact slurm"
    report = {"file": "site.yaml", "mismatches": [], "unchecked": [why]}
    assert doctor_site_lines(report) == [
        "SLURM site file site.yaml against the cluster: nothing it lacks among the values checked",
        f"  {why}",
    ]


def doctor(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`gpuflow doctor --profile profiles/slurm` with `site` as the site file, in the
    repository (its default config)."""
    env = {**harness.cluster_env(), "GPUFLOW_SLURM_SITE": str(site)}
    command = [str(BIN / "gpuflow"), "doctor", "--profile", "profiles/slurm", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)


def site_lines(stdout: str) -> list[str]:
    """The lines under doctor's site file head line."""
    lines = stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("SLURM site file "))
    found = []
    for line in lines[head + 1 :]:
        if not line.startswith("  "):
            break
        found.append(line.strip())
    return [lines[head], *found]


@pytest.mark.slurm
def test_doctor_names_each_value_of_a_wrong_site_file_the_test_cluster_lacks(
    slurm_cluster, tmp_path
):
    """A partition that does not exist, a GPU type no node has, a time limit above the
    partition's (10 h), memory above the node's (32 GB), an account the user has none of in
    SLURM's database: one line each, beginning with the site file's key."""
    site = yaml.safe_load(harness.TEST_SITE.read_text())
    site |= {"gpu_model": "h100", "account": "nope"}
    site["partitions"]["gpu"] |= {"max_runtime": 900, "available_gpu_models": ["h100"]}
    site["partitions"]["cpu"]["max_mem_mb"] = 64000
    site["partitions"]["gpu_h100"] = {"max_gpu": 4, "max_runtime": 600}
    wrong = tmp_path / "site.yaml"
    wrong.write_text(yaml.safe_dump(site))
    result = doctor(wrong)
    assert result.returncode == 1, result.stderr[-3000:]
    head, *lines = site_lines(result.stdout)
    assert (
        head == f"SLURM site file {wrong} against the cluster: 6 value(s) the cluster does not have"
    )
    host = socket.gethostname().split(".")[0]
    gres = f"gpu:{cluster.GPU_TYPE}:{cluster.N_GPUS}"
    listed = subprocess.run(["sinfo", "--noheader", "--format=%R"], capture_output=True, text=True)
    partitions = ", ".join(sorted(set(listed.stdout.split())))
    assert lines[:5] == [  # partitions in the file's order (safe_dump sorts them)
        f"partitions.cpu.max_mem_mb: 64000, above the memory of the partition's largest node, "
        f"{cluster.MEMORY_MB} MB ({host}: RealMemory)",
        "partitions.gpu.max_runtime: 900 minutes, above the partition's MaxTime of 600 minutes "
        "(10:00:00)",
        f"partitions.gpu.available_gpu_models: h100 is on no node of the partition (its GPUs: "
        f"{gres})",
        f"partitions.gpu_h100: no such partition on the cluster (it has {partitions})",
        f"gpu_model: h100 is on no node of GPU partition gpu (its GPUs: {gres}): sbatch refuses "
        "its GPU jobs",
    ]
    accounts = subprocess.run(
        ["sacctmgr", "-nP", "show", "assoc", f"user={getpass.getuser()}", "format=Account"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert lines[5:] == [
        f"account: 'nope' is not one of user {getpass.getuser()}'s accounts in SLURM's database "
        f"(sacctmgr show assoc: {', '.join(sorted(set(accounts)))})"
    ]


@pytest.mark.slurm
def test_doctor_finds_the_test_cluster_s_own_site_file_true_to_it(slurm_cluster):
    result = doctor(harness.TEST_SITE, "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["site"] == {"file": str(harness.TEST_SITE), "mismatches": [], "unchecked": []}
    assert report["machine"]["slurm_commands"]["sbatch"], "the rest of doctor's report stays"
    text = doctor(harness.TEST_SITE)
    assert text.returncode == 0, text.stderr[-3000:]
    assert site_lines(text.stdout) == [
        f"SLURM site file {harness.TEST_SITE} against the cluster: matches it"
    ]


pytest_plugins = ["tests.slurm.fixtures"]
