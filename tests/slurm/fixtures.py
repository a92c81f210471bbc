"""The live test cluster as one session fixture, shared by every SLURM test module.

Test modules load it with `pytest_plugins = ["tests.slurm.fixtures"]`: the cluster starts once
per test session (about 10 s) and its daemons are stopped by pid at the end.
"""

from __future__ import annotations

import pytest

from tests.slurm import cluster


@pytest.fixture(scope="session")
def slurm_cluster():
    """A running test cluster; its daemons are stopped after the session, by pid."""
    try:
        yield cluster.up()
    finally:
        cluster.down()
