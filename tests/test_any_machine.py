"""The test suite on any machine: `make test` where the test cluster cannot run.

The live-SLURM tests (marked `slurm`) need a machine that can host the test cluster: root, and
SLURM installed or apt-get to install it (tests/slurm/cluster.py `cannot_host`). Elsewhere
`make test` runs everything else, skips them and says in one line how many did not run, why,
and the command that runs them. `.ci/run` sets GPUFLOW_TEST_REQUIRE_SLURM=1: there such a
machine fails the session before any test runs, never skips them.

Each case runs pytest on a throwaway module of two live-SLURM tests and one plain test, with the
suite's conftest (tests/conftest.py) and settings (pyproject.toml), on a PATH that holds neither
SLURM's programs nor apt-get: the real check then finds a machine that cannot host the cluster
(as root for want of SLURM and apt-get, elsewhere for want of root), and no cluster is started.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REQUIRE_SLURM, SLURM_COMMAND
from tests.slurm import cluster

REPO = Path(__file__).resolve().parents[1]
THROWAWAY = """
import pytest


@pytest.mark.slurm
def test_needs_the_cluster():
    pass


@pytest.mark.slurm
def test_needs_it_too():
    pass


def test_needs_nothing():
    pass
"""


def pytest_on_a_machine_without_slurm(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """pytest with the suite's conftest and settings on the throwaway module, with no SLURM and
    no apt-get on PATH, none of the suite's switches from this session, and `env` added."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "test_throwaway.py").write_text(THROWAWAY, encoding="utf-8")
    clean = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("GPUFLOW_", "PYTEST_")) and name != "CI"
    }
    clean["PATH"] = str(tmp_path / "bin")
    clean["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.conftest"]
    command += ["-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), *args]
    return subprocess.run(
        [*command, "test_throwaway.py"],
        cwd=tmp_path,
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_make_test_skips_the_live_slurm_tests_there_and_says_so_in_one_line(tmp_path):
    result = pytest_on_a_machine_without_slurm(tmp_path, "-n", "2")  # as `make test` runs it
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed, 2 skipped" in result.stdout, result.stdout
    said = [line for line in result.stdout.splitlines() if line.startswith("gpuflow: ")]
    assert len(said) == 1, result.stdout
    assert said[0].startswith("gpuflow: 2 live-SLURM tests did not run: ")
    assert said[0].endswith(f"; run them as root on a machine with apt-get: {SLURM_COMMAND}")
    why = said[0].removeprefix("gpuflow: 2 live-SLURM tests did not run: ")
    assert why.startswith(("not root", "SLURM is not installed and there is no apt-get")), why
    skipped = [line for line in result.stdout.splitlines() if line.startswith("SKIPPED")]
    assert len(skipped) == 1 and skipped[0].startswith("SKIPPED [2] "), "-ra folds them in one"


def test_under_ci_a_machine_that_cannot_host_the_cluster_fails_before_any_test(tmp_path):
    result = pytest_on_a_machine_without_slurm(tmp_path, env={REQUIRE_SLURM: "1"})
    assert result.returncode != 0, result.stdout + result.stderr
    assert f"{REQUIRE_SLURM}=1 (.ci/run): the live-SLURM tests must run" in result.stderr
    assert "cannot host the test cluster: " in result.stderr
    assert "passed" not in result.stdout and "skipped" not in result.stdout


@pytest.mark.parametrize(
    ("uid", "slurm_installed", "apt_get", "running", "why"),
    [
        (0, True, True, "", None),
        (0, True, False, "", None),  # installed: no apt-get needed
        (0, False, True, "", None),  # apt-get installs it
        (0, False, False, "", "SLURM is not installed and there is no apt-get to install it"),
        (1000, True, True, "", "not root"),  # the daemons, /etc/slurm, the namespaces need root
        (1000, False, False, "1", None),  # a cluster started by hand, shared
    ],
)
def test_who_can_host_the_test_cluster(monkeypatch, uid, slurm_installed, apt_get, running, why):
    monkeypatch.setattr(os, "geteuid", lambda: uid)
    present = set(cluster.PROGRAMS if slurm_installed else ()) | ({"apt-get"} if apt_get else set())
    monkeypatch.setattr(cluster.shutil, "which", lambda name: name if name in present else None)
    monkeypatch.setenv("GPUFLOW_TEST_SLURM_RUNNING", running)
    found = cluster.cannot_host()
    if why is None:
        assert found is None
    else:
        assert found is not None and found.startswith(why)
