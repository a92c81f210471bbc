"""Runs on several nodes that never collide, and the site's NCCL settings, without a cluster.

- The rendezvous port: each job finds one free on its head node, searching from a start its job
  id sets (gpuflow.scaling.rendezvous); a port held by another process is passed over.
- NCCL settings: the SLURM site file's `nccl` block, checked when the workflow is read, reaches
  every process of a DDP training (here two gloo processes on one node), which records those in
  force; a variable exported by hand wins; changing the block re-runs nothing.
The same on two nodes, two jobs at once: tests/test_slurm_multinode.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuflow.errors import ConfigError, DataError
from gpuflow.scaling import rendezvous
from gpuflow.scaling.distributed import nccl_in_force, use_nccl
from gpuflow.slurm.nccl import nccl_json, site_nccl
from tests.conftest import REPO, snakemake, tiny_config

RUN = "results/scaling/runs/short/nodes~1/world~2/run.json"
SITE_NCCL = {"NCCL_SOCKET_IFNAME": "lo", "NCCL_DEBUG": "WARN", "NCCL_IB_TIMEOUT": 22}


def test_jobs_start_their_search_on_different_ports_and_wrap_round():
    assert rendezvous.first_port(7) != rendezvous.first_port(8)
    ports = rendezvous.candidates(rendezvous.PORTS - 1)
    assert ports[:2] == [rendezvous.FIRST_PORT + rendezvous.PORTS - 1, rendezvous.FIRST_PORT]
    assert sorted(ports) == list(range(rendezvous.FIRST_PORT, 32500)), "every port, once"
    assert max(ports) < 32768, "below Linux's ephemeral ports"


def test_a_port_held_on_the_head_node_is_passed_over(monkeypatch):
    job = 4242
    first = rendezvous.first_port(job)
    with socket.socket() as held:
        try:
            held.bind(("0.0.0.0", first))
        except OSError:
            pytest.skip(f"port {first} is in use on this machine already")
        held.listen()
        assert not rendezvous.binds(first)
        assert rendezvous.free_port(job) == first + 1
    assert rendezvous.free_port(job) == first, "free again once its holder closed it"


def test_the_endpoint_is_this_node_as_slurm_names_it_and_the_port_it_found():
    env = {**os.environ, "SLURM_JOB_ID": "123", "SLURMD_NODENAME": "gpu17"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-m", "gpuflow.scaling.rendezvous"],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    head, port = done.stdout.strip().split(":")
    assert head == "gpu17" and int(port) >= rendezvous.first_port(123)
    assert done.stderr.startswith(f"gpuflow rendezvous: gpu17:{port} (free on gpu17; SLURM job")


def test_the_site_nccl_block_is_names_and_text(tmp_path):
    assert site_nccl({}, "site.yaml") == {}
    assert site_nccl({"nccl": None}, "site.yaml") == {}, "the example's block: comments only"
    assert site_nccl({"nccl": {**SITE_NCCL, "NCCL_ALGO": None}}, "site.yaml") == {
        "NCCL_SOCKET_IFNAME": "lo", "NCCL_DEBUG": "WARN", "NCCL_IB_TIMEOUT": "22",
    }  # fmt: skip
    with pytest.raises(DataError, match=r"nccl: 'SOCKET_IFNAME' is not an NCCL variable"):
        site_nccl({"nccl": {"SOCKET_IFNAME": "ib0"}}, "site.yaml")
    with pytest.raises(DataError, match=r"nccl.NCCL_IB_DISABLE: True is not text or a number"):
        site_nccl({"nccl": {"NCCL_IB_DISABLE": True}}, "site.yaml")
    with pytest.raises(DataError, match=r"nccl: \['ib0'\] is not a block of settings"):
        site_nccl({"nccl": ["ib0"]}, "site.yaml")
    example = REPO / "profiles" / "slurm" / "site.yaml"
    assert "nccl:" in example.read_text() and nccl_json(REPO) == "'{}'", "defaults commented"


def test_the_site_sets_nccl_where_the_environment_does_not_and_a_hand_export_wins(
    monkeypatch, capsys
):
    for name in nccl_in_force():
        monkeypatch.delenv(name)
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.delenv("RANK", raising=False)
    in_force = use_nccl(json.dumps({"NCCL_SOCKET_IFNAME": "ib0", "NCCL_DEBUG": "WARN"}))
    assert in_force == {"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "ib0"}
    assert os.environ["NCCL_SOCKET_IFNAME"] == "ib0"
    assert capsys.readouterr().err == (
        "NCCL settings from the environment: NCCL_DEBUG=INFO (the site says WARN)\n"
    )
    with pytest.raises(ConfigError, match=r"--nccl GLOO_SOCKET_IFNAME"):
        use_nccl('{"GLOO_SOCKET_IFNAME": "lo"}')


def site_with_nccl(folder: Path, nccl: dict) -> Path:
    """The example site file with an `nccl` block."""
    site = yaml.safe_load((REPO / "profiles" / "slurm" / "site.yaml").read_text())
    site["nccl"] = nccl
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "site.yaml"
    path.write_text(yaml.safe_dump(site))
    return path


def two_process_config() -> dict:
    config = tiny_config("all")
    config["families"] = ["scaling"]
    config["scaling"].update(run=["short"], world_sizes=[2])
    return config


@pytest.mark.workflow
def test_nccl_settings_reach_every_process_and_changing_them_reruns_nothing(tmp_path, monkeypatch):
    """A two-process training on one node (torchrun --standalone) with the site's settings:
    both ranks record them. Then other settings: the finished run has nothing to do."""
    for name in nccl_in_force():
        monkeypatch.delenv(name)
    monkeypatch.setenv("GPUFLOW_SLURM_SITE", str(site_with_nccl(tmp_path, SITE_NCCL)))
    workdir = tmp_path / "run"
    result = snakemake(workdir, two_process_config(), RUN, "-p")
    assert '--nccl \'{"NCCL_DEBUG":"WARN","NCCL_IB_TIMEOUT":"22"' in result.stderr
    run = json.loads((workdir / RUN).read_text())
    expected = {"NCCL_DEBUG": "WARN", "NCCL_IB_TIMEOUT": "22", "NCCL_SOCKET_IFNAME": "lo"}
    assert run["nccl"] == expected
    assert [rank["nccl"] for rank in run["ranks"]] == [expected, expected]
    assert run["rendezvous"]["endpoint"] is None, "--standalone: torchrun's own"
    host, port = run["rendezvous"]["workers"].rsplit(":", 1)
    assert host and int(port) > 0

    other = site_with_nccl(tmp_path / "other", {"NCCL_DEBUG": "INFO"})
    monkeypatch.setenv("GPUFLOW_SLURM_SITE", str(other))
    again = snakemake(workdir, two_process_config(), RUN, "-n")
    assert "Nothing to be done" in again.stdout + again.stderr


def test_a_bad_nccl_block_stops_the_workflow_before_any_job(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUFLOW_SLURM_SITE", str(site_with_nccl(tmp_path, {"ib0": "x"})))
    result = snakemake(tmp_path / "run", two_process_config(), RUN, "-n", check=False)
    assert result.returncode == 1
    assert "nccl: 'ib0' is not an NCCL variable" in result.stdout + result.stderr
