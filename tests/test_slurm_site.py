"""SLURM start-up checks: partitions the config names exist in the site file, and a run refuses
to submit what an earlier run's SLURM jobs are still working on (a killed submitter's orphans)."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

import pytest
from snakemake_executor_plugin_slurm.utils import get_job_wildcards

from gpuflow.config import load_config
from gpuflow.errors import ConfigError, GpuflowError
from gpuflow.slurm.earlier_jobs import check_no_earlier_jobs, earlier_jobs
from gpuflow.slurm.queue import job_comment
from gpuflow.slurm.site import check_partitions
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


pytest_plugins = ["tests.slurm.fixtures"]
