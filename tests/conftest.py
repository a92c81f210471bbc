"""Shared fixtures: run the real workflow in a temporary folder with a small config."""

from __future__ import annotations

import fcntl
import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuflow.job import stopping  # imports no torch, reads no variable: the lines below still lead
from gpuflow.job.atomic import write_text
from tests.slurm import cluster

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TEST_CONFIGS = REPO / ".test"

# One OpenMP thread for every process of the suite that sets none itself (the tests' torch and
# the steps they start by hand; Snakemake gives each job its rule's `threads`, and steps given
# --threads set theirs). Under `make test` three workers share two cores, and a process with
# two threads waits at each parallel region for the one the scheduler took away. Set before
# torch is first imported. The whole suite, warm .venv, one run each: 728 s and 1,405 s of CPU
# (process accounting) with it, 790 s and 1,525 s without.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# No gpuflow variable of the shell's reaches the tests: a user's whole-node GPU locks
# (GPUFLOW_GPU_LOCK_DIR, exported by scripts/whole-node.sbatch), site file or finished-state
# records would change where every test's steps run. The tests set the ones they test; the
# suite's own switches (GPUFLOW_TEST_*, e.g. a shared test cluster) stay.
for name in [name for name in os.environ if name.startswith("GPUFLOW_")]:
    if not name.startswith("GPUFLOW_TEST_"):
        del os.environ[name]

SIGNAL_HANDLERS = {s: signal.getsignal(s) for s in stopping.STOPS_AND_CTRL_C}

# The live-SLURM tests (marked `slurm`) need a machine that can host the test cluster (root, and
# SLURM or apt-get: cluster.cannot_host). Elsewhere they are skipped before their fixtures start,
# and the session ends with one line that says how many, why, and the command that runs them;
# under REQUIRE_SLURM=1 (.ci/run) such a machine fails the session up front instead.
REQUIRE_SLURM = "GPUFLOW_TEST_REQUIRE_SLURM"
SLURM_SKIPPED = "live-SLURM test not run: this machine cannot host the test cluster"
SLURM_COMMAND = "sudo .venv/bin/pytest -m slurm -n 2"
CANNOT_HOST = pytest.StashKey[str | None]()


def pytest_configure(config: pytest.Config) -> None:
    """Decide once whether this machine can host the test cluster; where it cannot and the
    session must run the live-SLURM tests, stop before any test runs."""
    why = cluster.cannot_host()
    if why and os.environ.get(REQUIRE_SLURM) == "1":
        raise pytest.UsageError(
            f"{REQUIRE_SLURM}=1 (.ci/run): the live-SLURM tests must run, but this machine "
            f"cannot host the test cluster: {why}"
        )
    config.stash[CANNOT_HOST] = why


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A live-SLURM test on a machine that cannot host the cluster is skipped, here (one
    location, so `-ra` folds them into one line) and before its fixtures start."""
    why = item.config.stash[CANNOT_HOST]
    if why and item.get_closest_marker("slurm"):
        pytest.skip(f"{SLURM_SKIPPED}: {why}")


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """One line for the live-SLURM tests that did not run, above the short test summary
    (counted from the reports, which pytest-xdist's workers send here)."""
    skipped = [
        report
        for report in terminalreporter.stats.get("skipped", [])
        if SLURM_SKIPPED in str(report.longrepr)
    ]
    if skipped:
        terminalreporter.write_line(
            f"gpuflow: {len(skipped)} live-SLURM tests did not run: {config.stash[CANNOT_HOST]}; "
            f"run them as root on a machine with apt-get: {SLURM_COMMAND}"
        )


@pytest.fixture(autouse=True)
def no_stop_handling_left():
    """After each test no stop request or deferral stands and the suite's signal handlers are
    back. A step run in-process leaves gpuflow's (a Job keeps them for the process's life), an
    in-process dry run Snakemake's; a later test in the same worker would meet them."""
    yield
    stopping.install()
    for signum, handler in SIGNAL_HANDLERS.items():
        signal.signal(signum, handler)


def tiny_config(name: str) -> dict[str, Any]:
    """A fresh copy of `.test/<name>/config.yaml`, a tiny config. A test's working directory
    has no config/config.yaml, so the workflow reads it over the schema's defaults."""
    path = TEST_CONFIGS / name / "config.yaml"
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def workflow_env() -> dict[str, str]:
    """The environment rules run in: this venv's `gpuflow` and `snakemake` first on PATH."""
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def config_file(workdir: Path, config: dict[str, Any]) -> Path:
    """`config` written (atomically) into `workdir` under a name taken from its content, so
    tests that dry-run the session's shared finished run at once never read each other's (one
    shared name raced: seen once in a full run)."""
    workdir.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(config)
    path = workdir / f"test-config-{hashlib.sha256(text.encode()).hexdigest()[:12]}.yaml"
    write_text(path, text)
    return path


def snakemake(
    workdir: Path, config: dict[str, Any], *args: str, check: bool = True, timeout: int = 900
) -> subprocess.CompletedProcess[str]:
    """Run the repository's Snakefile in `workdir` with `config` (schema defaults fill the rest)."""
    configfile = config_file(workdir, config)
    command = [
        str(BIN / "snakemake"),
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(workdir),
        "--configfile",
        str(configfile),
        "--cores",
        "2",
        *args,
    ]
    result = subprocess.run(
        command, capture_output=True, text=True, env=workflow_env(), timeout=timeout
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"snakemake failed ({result.returncode}):\n"
            f"{result.stdout[-4000:]}\n{result.stderr[-8000:]}"
        )
    return result


@pytest.fixture
def one_thread_per_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """One torch/OpenMP thread, in the test and in the steps it starts, as Snakemake gives a
    1-thread job: quick and equal everywhere on a busy 2-core machine."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="module")
def scaling_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The scaling family's tiny prepared splits, made once per module (read-only)."""
    from tests.test_scaling_ddp import prepare

    return prepare(tmp_path_factory.mktemp("tiny-data"))


def job_counts(dry_run_output: str) -> dict[str, int]:
    """Jobs per rule from the 'Job stats' table that `snakemake --dry-run` prints."""
    counts = {}
    for line in dry_run_output.splitlines():
        parts = line.split()
        if (
            len(parts) == 2
            and parts[1].isdigit()
            and parts[0].isidentifier()
            and parts[0] != "total"
        ):
            counts[parts[0]] = int(parts[1])
    return counts


@pytest.fixture
def run_snakemake() -> Callable[..., subprocess.CompletedProcess[str]]:
    """`run_snakemake(workdir, config, *args)` runs the real workflow (see `snakemake`)."""
    return snakemake


def gpuflow(
    *args: str, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `gpuflow <step> ...` as a separate process, as a rule would (`env` added to the
    environment)."""
    result = subprocess.run(
        [str(BIN / "gpuflow"), *args],
        capture_output=True,
        text=True,
        env={**workflow_env(), **(env or {})},
    )
    if check and result.returncode != 0:
        raise AssertionError(f"gpuflow {args[0]} failed:\n{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture
def run_gpuflow() -> Callable[..., subprocess.CompletedProcess[str]]:
    """`run_gpuflow(step, *args)` runs the CLI in a subprocess."""
    return gpuflow


@pytest.fixture(scope="session")
def finished_all(tmp_path_factory, worker_id: str) -> Path:
    """One undisturbed run of every family on `.test/all`, shared by the whole session: made
    once, by the first pytest-xdist worker that needs it, while the others wait on its lock.

    The suites that only read a family's results read them here (FINISHED_ALL_MODULES). Tests
    treat it as read-only: dry runs and reports may use it in place; anything that runs,
    deletes or corrupts jobs works on a copy (shutil.copytree(..., symlinks=True)).
    """
    base = tmp_path_factory.getbasetemp()
    shared = base if worker_id == "master" else base.parent  # the session's, not the worker's
    workdir, made = shared / "finished-all", shared / "finished-all.made"
    with open(shared / "finished-all.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not made.exists():
            snakemake(workdir, tiny_config("all"))
            made.touch()
    return workdir


def xdist_group_of(nodeid: str) -> str:
    """The group a test runs in under `make test` (pytest -n N): one worker runs a group whole.

    The live-SLURM tests fall in two groups, run on two workers at once against one cluster
    (each module beside the other worker's, or alone on it: tests/slurm/fixtures.py); the
    suites that torch.compile the same model share one (compiled once: the graphs are cached
    in-process), and every other module is a group of its own (its module fixtures run once;
    the suites over the shared finished run spread over the workers: `finished_all`).
    """
    path = nodeid.split("::")[0]
    name = Path(path).name
    if name.startswith("test_slurm_"):
        return "slurm-2" if name in SECOND_SLURM_MODULES else "slurm"
    if name in TORCH_COMPILE_MODULES:
        return "torch_compile"
    return path


# The live-SLURM modules of the second SLURM group: about half of the time of the modules that
# share the cluster (the first group also holds the ones that use it alone, which run last).
SECOND_SLURM_MODULES = (
    "test_slurm_stop_resume.py",
    "test_slurm_cluster.py",
    "test_slurm_memory.py",
    "test_slurm_multinode.py",
)
# Every suite that reads `finished_all`. The first makes the run, right after the live-SLURM
# groups start; the others follow every other group, so no worker waits on the run's lock. As one
# group on one worker they were the suite's longest chain: 1,610 of its 1,652 s (2026-11-28).
FINISHED_ALL_MODULES = (
    "test_hardening_workflow.py",
    "test_fluency_workflow.py",
    "test_ssvae_workflow.py",
    "test_scaling_workflow.py",
    "test_sweep_workflow.py",
    "test_settings_workflow.py",
    "test_ledger.py",
    "test_timeline_workflow.py",
    "test_tracking.py",
)
# gpu-check's smoke test first (file order), then the perplexity compile tests on its model's shape.
TORCH_COMPILE_MODULES = ("test_gpu_check.py", "test_perplexity_compile.py")
# The longest groups, started first, one on each worker; the others follow, most tests first.
FIRST_GROUPS = ("slurm", "slurm-2", f"tests/{FINISHED_ALL_MODULES[0]}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The live-SLURM groups first (the longest, mostly waiting on SLURM, so they overlap the
    rest of the suite on the other workers), within them the modules that use the cluster alone
    last (the modules that share it run on both workers first); the suite that makes the shared
    finished run next, then the other groups by their number of tests, most first
    (pytest-xdist's order), the other suites over the finished run last."""
    groups = [xdist_group_of(item.nodeid) for item in items]
    sizes = {group: groups.count(group) for group in set(groups)}
    readers = {f"tests/{name}" for name in FINISHED_ALL_MODULES} - set(FIRST_GROUPS)

    def rank(index: int) -> tuple[int, bool, int, bool]:
        group = groups[index]
        first = FIRST_GROUPS.index(group) if group in FIRST_GROUPS else len(FIRST_GROUPS)
        alone = getattr(getattr(items[index], "module", None), "CLUSTER_ALONE", False)
        return first, group in readers, -sizes[group], alone

    order = sorted(range(len(items)), key=rank)
    items[:] = [items[i] for i in order]


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist schedules whole groups (`xdist_group_of`) on one worker each, in the order of
    `pytest_collection_modifyitems` (not re-sorted by their number of tests)."""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group_of(nodeid)

    return GroupScheduling(config, log)


def wait_for(
    condition: Callable[[], Any], what: str, timeout: float, interval: float = 0.2
) -> None:
    """Poll `condition()` every `interval` seconds until it holds; fail naming `what` after
    `timeout` seconds. A path that vanishes while `condition` reads a live tree (a job's
    atomic write, Snakemake removing empty output folders) counts as not yet."""
    deadline = time.monotonic() + timeout
    while not holds_now(condition):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(interval)


def alive(pid: int) -> bool:
    """Whether process `pid` still exists (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def holds_now(condition: Callable[[], Any]) -> bool:
    """Whether `condition()` holds now; False when a path it reads vanished mid-check."""
    try:
        return bool(condition())
    except FileNotFoundError:
        return False


def wait_while_running(
    condition: Callable[[], Any],
    process: subprocess.Popen,
    what: str,
    timeout: float,
    interval: float = 0.01,
    log: Path | None = None,
) -> Any:
    """Poll `condition()` while `process` runs until it holds, and return its value; fail naming
    `what` (with `log`'s text) when the process ended first or `timeout` seconds passed."""
    wait_for(lambda: condition() or process.poll() is not None, what, timeout, interval)
    value = condition()
    assert value, f"{what}: the process ended first" + (f"\n{log.read_text()}" if log else "")
    return value


def wait_for_file(path: Path, process: subprocess.Popen, timeout: float) -> None:
    """Wait until `process` has written `path` (polled every 0.01 s); fail when the process
    ended or `timeout` seconds passed without it."""
    wait_while_running(path.exists, process, f"{path} to appear", timeout)


def files_left(folder: Path) -> list[str]:
    """Names of the files in `folder` (none when it is missing) but the `jobs/` folder, where
    a failed job's record goes (gpuflow.job.paths)."""
    if not folder.exists():
        return []
    return sorted(p.name for p in folder.iterdir() if p.name != "jobs")
