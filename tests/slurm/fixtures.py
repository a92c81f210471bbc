"""The live test cluster as one session fixture, shared by every SLURM test module.

Test modules load it with `pytest_plugins = ["tests.slurm.fixtures"]`: the cluster starts once
per test session (about 10 s) and its daemons are stopped by pid at the end.

With GPUFLOW_TEST_SLURM_RUNNING=1 the session uses a cluster already started by hand
(`python tests/slurm/cluster.py up`) and leaves it running, so several test sessions (say, in
two checkouts) can share one cluster; it must answer, or the tests fail.
"""

from __future__ import annotations

import os

import pytest

from tests.slurm import cluster


@pytest.fixture(scope="session")
def slurm_cluster():
    """A running test cluster; its daemons are stopped after the session, by pid."""
    if os.environ.get("GPUFLOW_TEST_SLURM_RUNNING") == "1":
        if not cluster.answers():
            raise cluster.ClusterError("GPUFLOW_TEST_SLURM_RUNNING=1 but no cluster answers")
        yield {}
        return
    try:
        yield cluster.up()
    finally:
        cluster.down()
