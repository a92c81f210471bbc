"""SLURM start-up checks: partitions the config names exist in the site file, every job fits one
of them, and a run refuses to submit what an earlier run's SLURM jobs are still working on (a
killed submitter's orphans)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from snakemake_executor_plugin_slurm.utils import get_job_wildcards

from gpuflow.errors import ConfigError, GpuflowError
from gpuflow.settings.validate import load_config
from gpuflow.slurm.earlier_jobs import check_no_earlier_jobs, earlier_jobs
from gpuflow.slurm.fit import PlannedJob, check_jobs_fit, grown, retry_limits
from gpuflow.slurm.queue import job_comment
from gpuflow.slurm.site import check_partitions
from tests.conftest import BIN, tiny_config, workflow_env
from tests.slurm import harness

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


pytest_plugins = ["tests.slurm.fixtures"]
