"""Runs on several nodes that never collide, without a cluster: each job finds a rendezvous
port free on its head node, searching from a start its job id sets (gpuflow.scaling.rendezvous);
a port held by another process is passed over. Two two-node jobs at once on the test cluster:
tests/test_slurm_multinode.py.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from gpuflow.scaling import rendezvous
from tests.conftest import REPO


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
