"""The live test cluster, shared by every SLURM test module and by the pytest workers that run
them (`make test` runs the SLURM modules in two groups, on two workers, at once).

Test modules load it with `pytest_plugins = ["tests.slurm.fixtures"]` and ask for
`slurm_cluster`. The first worker that needs the cluster starts it (about 10 s), the others use
it, and the last to finish stops its daemons (by pid). A module uses the cluster beside the
other worker's modules, or, where it sets `CLUSTER_ALONE = True` (it stops daemons), alone: no
other module runs on it meanwhile.
Those run last in their group (tests/conftest.py), once the modules that share it are done.

With GPUFLOW_TEST_SLURM_RUNNING=1 the session uses a cluster already started by hand
(`python tests/slurm/cluster.py up`) and leaves it running, so several test sessions (say, in
two checkouts) can share one cluster; it must answer, or the tests fail.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import alive
from tests.slurm import cluster

USERS = Path(f"{cluster.STATE}.users")  # one file per pytest process using the cluster
LIFECYCLE_LOCK = Path(f"{cluster.STATE}.lifecycle.lock")  # who starts and stops it
USE_LOCK = Path(f"{cluster.STATE}.use.lock")  # shared by modules, exclusive for CLUSTER_ALONE
# passed by every module on its way to USE_LOCK: a module waiting to be alone holds it, so no
# other starts meanwhile (flock alone would let shared holders take turns for ever)
TURNSTILE = Path(f"{cluster.STATE}.turnstile.lock")


@contextmanager
def locked(path: Path, mode: int) -> Iterator[None]:
    """Hold `path`'s flock in `mode` (LOCK_SH or LOCK_EX) for the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, mode)
        yield


@contextmanager
def cluster_use(alone: bool) -> Iterator[None]:
    """Use the cluster beside other modules, or alone: a module that waits to be alone goes
    next, before any module that asks after it."""
    path = USE_LOCK
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as use:
        with locked(TURNSTILE, fcntl.LOCK_EX):
            fcntl.flock(use, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        yield


def users() -> list[Path]:
    """The live users' files (those of dead processes removed)."""
    USERS.mkdir(parents=True, exist_ok=True)
    found = []
    for user in USERS.iterdir():
        if user.name.isdigit() and alive(int(user.name)):
            found.append(user)
        else:
            user.unlink(missing_ok=True)
    return found


@pytest.fixture(scope="session")
def cluster_session() -> Iterator[dict[str, Any]]:
    """A running test cluster for this pytest process: started by the first user, stopped by
    the last."""
    if os.environ.get("GPUFLOW_TEST_SLURM_RUNNING") == "1":
        if not cluster.answers():
            raise cluster.ClusterError("GPUFLOW_TEST_SLURM_RUNNING=1 but no cluster answers")
        yield {}
        return
    me = USERS / str(os.getpid())
    with locked(LIFECYCLE_LOCK, fcntl.LOCK_EX):
        pids = {} if users() else cluster.up()
        me.touch()
    try:
        yield pids
    finally:
        with locked(LIFECYCLE_LOCK, fcntl.LOCK_EX):
            me.unlink(missing_ok=True)
            if not users():
                cluster.down()


@pytest.fixture(scope="module")
def slurm_cluster(cluster_session, request) -> Iterator[dict[str, Any]]:
    """The running cluster for one test module: beside other modules, or alone where the module
    sets CLUSTER_ALONE."""
    with cluster_use(getattr(request.module, "CLUSTER_ALONE", False)):
        yield cluster_session
