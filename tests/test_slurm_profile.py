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
import subprocess

import pytest
import yaml

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


def planned_resources(tmp_path, snakefile, config) -> list[tuple[str, dict[str, str]]]:
    """(rule, resources) of every job of a dry run through the SLURM profile."""
    command = harness.profile_command(tmp_path, snakefile, config, "--dry-run")
    result = subprocess.run(
        command, capture_output=True, text=True, env=harness.cluster_env(), cwd=REPO, check=False
    )
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
