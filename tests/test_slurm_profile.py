"""What the SLURM profile asks of every job, without a cluster (dry runs and the YAML files).

- Only GPU rules ask for the site's GPU model: a CPU job with `--gpus=<model>:0` is refused by
  sites whose submit filter rejects GPU requests on CPU partitions.
- profiles/default is Snakemake's workflow profile: loaded for local runs and, key by key, on
  top of `--profile profiles/slurm` too. It may add nothing a cluster run would feel: each of
  its keys is one the SLURM profile sets to the same value, or `cores` (with a cluster executor
  Snakemake caps no job by it: four 1-core jobs ran at once from a 2-core submit node).
"""

from __future__ import annotations

import re
import shlex
import subprocess
from types import SimpleNamespace

import pytest
import yaml
from snakemake_executor_plugin_slurm.submit_string import get_submit_command
from snakemake_executor_plugin_slurm.utils import set_gres_string
from snakemake_executor_plugin_slurm.validation import validate_slurm_extra

from gpuflow.ops.snakemake_adapter import profile_settings
from tests.conftest import tiny_config
from tests.slurm import harness

REPO = harness.REPO
PROBE = {
    "probe": {
        "n_gpu_jobs": 1, "hold": 0, "kill_hold": 0, "seed": 0,
        "resources": {
            rule: {"gpu": gpu, "cpus_per_gpu" if gpu else "cpus_per_task": 1, "mem_mb": 500,
                   "runtime": 5}
            for rule, gpu in (("probe_gpu", 1), ("probe_cpu", 0), ("probe_retried", 1))
        },
    }
}  # fmt: skip


def planned_resources(
    tmp_path, snakefile, config, env: dict[str, str] | None = None
) -> list[tuple[str, dict[str, str]]]:
    """(rule, resources) of every job of a dry run through the SLURM profile (`env` added to the
    test cluster's environment)."""
    command = harness.profile_command(tmp_path, snakefile, config, "--dry-run")
    env = {**harness.cluster_env(), **(env or {})}
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    rules = re.findall(r"^rule (\w+):\n(?:    .*\n)*?    resources: (.*)$", result.stdout, re.M)
    return [(rule, dict(kv.split("=", 1) for kv in text.split(", "))) for rule, text in rules]


@pytest.mark.workflow
def test_only_gpu_rules_ask_for_the_site_gpu_model(tmp_path):
    site_model = yaml.safe_load(harness.TEST_SITE.read_text())["gpu_model"]
    probe = dict(planned_resources(tmp_path / "probe", REPO / "tests/slurm/Snakefile", PROBE))
    assert probe["probe_gpu"]["gpu_model"] == probe["probe_retried"]["gpu_model"] == site_model
    assert "gpu_model" not in probe["probe_cpu"]
    assert "gpu_model" not in probe["all"], "a rule without a gpu resource asks for none"
    planned = planned_resources(tmp_path / "slice", REPO / "Snakefile", tiny_config("slurm"))
    gpu_rules = {rule for rule, res in planned if int(res.get("gpu", 0)) > 0}
    assert gpu_rules == {"fluency_perplexity", "ssvae_train", "scaling_train", "sweep_shard"}
    for rule, resources in planned:
        wanted = site_model if rule in gpu_rules else None
        assert resources.get("gpu_model") == wanted, (rule, resources)


def test_the_workflow_profile_adds_nothing_to_a_cluster_run_but_cores():
    local = yaml.safe_load((REPO / "profiles" / "default" / "config.yaml").read_text())
    slurm = yaml.safe_load((REPO / "profiles" / "slurm" / "config.v8+.yaml").read_text())
    assert {key: slurm.get(key) for key in local if key != "cores"} == {
        key: value for key, value in local.items() if key != "cores"
    }


def sbatch_line(resources: dict[str, str]) -> str:
    """The sbatch command line the SLURM plugin makes of a job's resources as a dry run prints
    them, once they pass the plugin's own check of slurm_extra."""

    class Resources(dict):
        __getattr__ = dict.get

    values = {name: int(value) if value.isdigit() else value for name, value in resources.items()}
    job = SimpleNamespace(resources=Resources(values), threads=1)
    validate_slurm_extra(job)
    params = {
        "run_uuid": "job", "slurm_logfile": "log", "comment_str": "c", "account": "",
        "partition": "", "workdir": "",
    }  # fmt: skip
    return get_submit_command(job, params) + set_gres_string(job)


SUBMISSION = {
    "qos": "gpuflow-qos",
    "constraint": "fast&big",
    "reservation": "maint window",
    "mail_type": "FAIL,TIME_LIMIT_90",
    "mail_user": "me@example.org",
    "stop_warning_minutes": 5,
    "max_jobs": 7,
    "max_jobs_per_timespan": "3/2s",
}


@pytest.mark.workflow
def test_the_site_file_s_submission_values_reach_every_job_s_sbatch_line(tmp_path, monkeypatch):
    """QOS, constraint, reservation and mail options of site.yaml reach sbatch for every job,
    GPU and CPU, beside the stop warning, without an edit of the profile; its job cap and
    submission rate reach Snakemake."""
    site = {**yaml.safe_load(harness.TEST_SITE.read_text()), **SUBMISSION}
    site_file = tmp_path / "site.yaml"
    site_file.write_text(yaml.safe_dump(site))
    env = {"GPUFLOW_SLURM_SITE": str(site_file)}
    planned = planned_resources(tmp_path / "probe", REPO / "tests/slurm/Snakefile", PROBE, env)
    jobs = {rule: sbatch_line(resources) for rule, resources in planned if rule != "all"}
    assert set(jobs) == {"probe_gpu", "probe_cpu", "probe_retried"}
    for rule, line in jobs.items():
        words = shlex.split(line)
        for option in ("--qos=gpuflow-qos", "-C", "fast&big", "--reservation=maint window",
                       "--mail-type=FAIL,TIME_LIMIT_90", "--mail-user=me@example.org",
                       "--signal=USR1@300"):  # fmt: skip
            assert option in words, (rule, option, line)
    monkeypatch.setenv("GPUFLOW_SLURM_SITE", str(site_file))
    cli, _ = profile_settings([str(REPO / "profiles" / "slurm")])
    assert cli.jobs == 7
    rate = cli.max_jobs_per_timespan
    assert (rate.max_jobs, rate.timespan) == (3, 2)
