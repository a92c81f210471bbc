"""The SLURM profile and whole-node mode on a live SLURM, on a node with four fake GPUs.

The cluster (tests/slurm/cluster.py) is Debian's slurmctld + slurmd + munge + slurmdbd over
MariaDB on loopback, installed with apt-get when missing; if it cannot start, these tests fail
with the daemons' logs. The workflow is tests/slurm/Snakefile: real `gpuflow probe` steps whose
rules take resources exactly like every family's rules (rule_resources in common.smk).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
import yaml

from gpuflow.job.paths import RECORD, job_file
from gpuflow.ops.probe import seeded_value
from gpuflow.slurm.site import SITE_ENV
from tests.conftest import wait_for
from tests.slurm import cluster, harness

pytestmark = [pytest.mark.slurm, pytest.mark.workflow]
pytest_plugins = ["tests.slurm.fixtures"]
# it counts how SLURM packs its jobs onto a node's four GPUs: on partition 'pack', a node where
# no other test runs (tests/slurm/nodes.py), beside the other modules on the host's node
PACK = "pack"

SNAKEFILE = harness.REPO / "tests" / "slurm" / "Snakefile"
HOLD = 15


def probe_config(n_gpu_jobs: int, kill_hold: int) -> dict[str, Any]:
    return {
        "probe": {
            "n_gpu_jobs": n_gpu_jobs,
            "hold": HOLD,
            "kill_hold": kill_hold,
            "seed": 0,
            "resources": {
                "probe_gpu": {"gpu": 1, "cpus_per_gpu": 2, "mem_mb": 1000, "runtime": 5},
                "probe_cpu": {"gpu": 0, "cpus_per_task": 1, "mem_mb": 500, "runtime": 5},
                "probe_retried": {"gpu": 1, "cpus_per_gpu": 1, "mem_mb": 700, "runtime": 5},
            },
        }
    }


@pytest.fixture(scope="module")
def profile_run(slurm_cluster, tmp_path_factory):
    """The probe workflow through `snakemake --profile profiles/slurm`, one job cancelled, with
    the test site's GPU partition on the 'pack' node.

    Job status from sacct, as in production: the cancelled job is "CANCELLED by <uid>" there,
    a state plugin 2.8.0 alone does not know (the run hung for 10 minutes after the cancel)."""
    workdir = tmp_path_factory.mktemp("slurm-profile")
    site = yaml.safe_load(harness.TEST_SITE.read_text())
    site["partitions"] = {PACK: site["partitions"]["gpu"], "cpu": site["partitions"]["cpu"]}
    site_file = tmp_path_factory.mktemp("pack-site") / "site.yaml"
    site_file.write_text(yaml.safe_dump(site))
    result, cancelled = harness.run_profile(
        workdir,
        SNAKEFILE,
        probe_config(5, kill_hold=300),
        cancel_rule="probe_retried",
        cancel_after="results/probe/logs/retried.log",
        env={SITE_ENV: str(site_file)},
    )
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    records = {p.stem: r for p, r in zip_records(workdir / "results" / "probe")}
    # the cancelled probe held for 300 s: anything of its job still alive now outlived it (the
    # harness ends what proctrack/linuxproc loses, as cgroups would)
    left = {job_id: harness.job_processes(job_id) for job_id in cancelled}
    return {"workdir": workdir, "log": result.stderr, "cancelled": cancelled, "records": records,
            "left": left}  # fmt: skip


def zip_records(folder: Path) -> list[tuple[Path, dict[str, Any]]]:
    # the probes' own records (their job records are in jobs/)
    paths = sorted(p for p in folder.glob("*.json") if not p.name.endswith(".telemetry.json"))
    return list(zip(paths, harness.read_records(paths), strict=True))


def sacct_rows(name: str) -> list[list[str]]:
    """sacct -X (one row a job) of the jobs named `name`: raw id, comment, state."""
    return harness.sacct_jobs(name, "JobIDRaw,Comment,State")


def accounted_run(profile_run: dict[str, Any]) -> str:
    """The run's SLURM job name, once sacct lists every job of it (each probe's, and the
    cancelled one) as ended. The run read its jobs' states from squeue: slurmdbd may store the
    last ends a moment later."""
    name, expected = harness.run_id(profile_run["log"]), len(profile_run["records"]) + 1

    def all_ended() -> bool:
        states = [state for _, _, state in sacct_rows(name)]
        return len(states) == expected and not {"PENDING", "RUNNING", "COMPLETING"} & set(states)

    wait_for(all_ended, "sacct's ends", 60)
    return name


def gpu_records(records: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for name, r in records.items() if name.startswith("gpu~")]


def test_gpu_jobs_are_submitted_with_gpus_cpus_per_gpu_and_mem(profile_run):
    for record in gpu_records(profile_run["records"]):
        job = harness.slurm_job(record["slurm_job_id"])
        assert job["Partition"] == PACK
        assert job["TresPerJob"] == f"gres:gpu:{cluster.GPU_TYPE}:1"
        assert job["CpusPerTres"] == "gres:gpu:2"
        # the plugin adds 1 MB to array jobs for their payload
        assert job["MinMemoryNode"] in ("1000M", "1001M")
        assert job["TimeLimit"] == "00:05:00"
        assert "NumTasks=" not in job.get("TresPerTask", "")


def test_cpu_rules_go_to_the_cpu_partition_without_a_gpu(profile_run):
    record = profile_run["records"]["cpu"]
    job = harness.slurm_job(record["slurm_job_id"])
    assert job["Partition"] == "cpu"
    # no GPU request at all (a site's gpu_model goes on GPU rules only: no --gpus=<model>:0)
    assert job.get("TresPerJob", "(null)") in ("(null)", "")
    assert not record["cuda_visible_devices"]


def test_four_gpu_jobs_run_at_once_on_distinct_devices(profile_run):
    """SLURM packs the run's one-GPU jobs four at a time onto the four-GPU node: the five
    probes, the cancelled job and its retry, counted from SLURM's allocations (the cancelled
    job may hold a GPU beside three probes while the fourth waits; how long a step takes to
    start inside its job is not SLURM's packing). Steps that ran at once saw distinct GPUs."""
    records = gpu_records(profile_run["records"])
    assert len(records) == 5
    allocations = harness.gpu_allocations(accounted_run(profile_run))
    assert len(allocations) == 7 and {a["gpus"] for a in allocations} == {1}
    assert harness.max_concurrent(allocations) == 4
    for a, b in harness.overlapping_pairs(records):
        assert a["cuda_visible_devices"] != b["cuda_visible_devices"], (a, b)
    assert {r["cuda_visible_devices"] for r in records} == {"0", "1", "2", "3"}
    assert all(r["slurm_job_id"] and r["host"] for r in records)


def test_a_job_cancelled_mid_run_is_retried_with_more_memory_and_time(profile_run):
    assert len(profile_run["cancelled"]) == 1
    first = harness.slurm_job(profile_run["cancelled"][0])
    assert first["JobState"] == "CANCELLED"
    retried = profile_run["records"]["retried"]
    assert retried["slurm_job_id"] != profile_run["cancelled"][0]
    second = harness.slurm_job(retried["slurm_job_id"])
    assert second["JobState"] == "COMPLETED"
    assert (first["MinMemoryNode"], second["MinMemoryNode"]) == ("700M", "1400M")
    assert (first["TimeLimit"], second["TimeLimit"]) == ("00:05:00", "00:10:00")


def test_a_job_cancelled_by_hand_is_seen_as_ended_within_two_status_checks(profile_run):
    """sacct says "CANCELLED by 0"; the run reports the job failed as CANCELLED at a status
    check soon after it ended (the test profile checks 4 s after a submission, then every
    14, 24, ... s while no job ends), instead of waiting on it."""
    [cancelled] = profile_run["cancelled"]
    reported = harness.error_reported_at(profile_run["log"], "probe_retried")
    assert f"SLURM-job '{cancelled}' failed, SLURM status is: 'CANCELLED'" in profile_run["log"]
    ended = harness.ended_at(cancelled)
    assert 0 <= reported - ended <= 60, (ended, reported)


def test_no_process_of_the_cancelled_job_outlives_it(profile_run):
    assert profile_run["left"] == {profile_run["cancelled"][0]: []}


def test_every_job_of_the_run_is_in_the_accounting_database_with_its_rule(profile_run):
    rows = {
        job_id: (comment, state)
        for job_id, comment, state in sacct_rows(accounted_run(profile_run))
    }
    for name, record in profile_run["records"].items():
        comment, state = rows[record["slurm_job_id"]]
        assert comment.startswith(f"rule_probe_{name.split('~')[0]}") and state == "COMPLETED"
    [cancelled] = profile_run["cancelled"]
    assert rows[cancelled] == ("rule_probe_retried", "CANCELLED by 0")
    assert len(rows) == len(profile_run["records"]) + 1


def test_the_run_ends_with_an_efficiency_report_of_its_jobs(profile_run):
    folder = profile_run["workdir"] / "results" / "slurm"
    report = pd.read_csv(folder / f"efficiency_report_{harness.run_id(profile_run['log'])}.csv")
    rules = {comment.split("_wildcards_")[0] for comment in report["RuleName"]}
    assert rules == {"rule_probe_gpu", "rule_probe_cpu", "rule_probe_retried"}
    assert (report["CPU Efficiency (%)"] >= 0).all() and (report["RequestedMem_MB"] > 0).all()


def test_every_output_holds_the_number_its_seed_gives_on_this_machine(profile_run):
    """Each probe's seeded computation, done through SLURM on a fake GPU (a CPU here), equals
    the same computation done in this process: jobs ran their own wildcards' commands."""
    seeds = {f"gpu~{i}": i for i in range(5)} | {"cpu": 100, "retried": 200}
    assert profile_run["records"].keys() == seeds.keys()
    for name, record in profile_run["records"].items():
        assert record["value"] == seeded_value(seeds[name], torch.device("cpu")), name


def device_lock_spans(workdir: Path, names: list[str]) -> list[dict[str, float]]:
    """When each probe job held its device lock, from its job record (gpuflow.job.record): the
    record starts once the lock is taken and ends before it is let go. A probe that waited for
    a lock counts from when it got it, not from when its step, after importing torch, began."""
    outputs = [workdir / "results" / "probe" / f"{name}.json" for name in names]
    records = harness.read_records(job_file(output, RECORD) for output in outputs)
    return [{"start": record["started"], "end": record["ended"]} for record in records]


def test_whole_node_mode_gives_four_concurrent_jobs_four_distinct_devices(slurm_cluster, tmp_path):
    state, log = harness.run_whole_node(
        tmp_path,
        SNAKEFILE,
        probe_config(4, kill_hold=0),
        ["-p", PACK, "--gpus=4", "--cpus-per-gpu=2", "--mem=8000"],
    )
    assert state == "COMPLETED", log[-4000:]
    records = {p.stem: r for p, r in zip_records(tmp_path / "results" / "probe")}
    gpus = gpu_records(records)
    allocation = {r["slurm_job_id"] for r in records.values()}
    assert len(allocation) == 1, "every job ran inside the one allocation"
    assert harness.max_concurrent(device_lock_spans(tmp_path, [f"gpu~{i}" for i in range(4)])) == 4
    assert sorted(r["cuda_visible_devices"] for r in gpus) == ["0", "1", "2", "3"]
    assert records["retried"]["cuda_visible_devices"] in {"0", "1", "2", "3"}
    assert records["cpu"]["cuda_visible_devices"] == "", "a CPU job sees no GPU"


def test_cluster_daemons_answer(slurm_cluster):
    nodes = subprocess.run(["sinfo", "-h", "-o", "%G"], capture_output=True, text=True)
    assert f"gpu:{cluster.GPU_TYPE}:{cluster.N_GPUS}" in nodes.stdout
