"""SLURM job start-up on the test cluster: a job's start to its step's first line, auto vs fixed.

Usage: python benchmarks/slurm_job_start.py [--rounds 3] [--checkout PATH] [--jobs 1]
                                            [--fixed-minutes 30] [--keep DIR] [--save-record PATH]

Runs a small real workflow through `--profile profiles/slurm` (with the tests' layer,
tests/slurm/profile, and site file, tests/slurm/site.yaml) on the loopback test cluster of
tests/slurm/cluster.py: the fluency and scaling families at the embedded default size of
config/config.yaml (400 texts scored by the embedded LM in 2 shards; the IMDB configuration's
1,536 training reviews, one epoch, on one process), their GPU rules `fluency_perplexity` and
`scaling_train` as 1-GPU jobs. Once with `runtime: auto` on those two rules, so the Snakemake
inside each job evaluates their work models as it builds its DAG (the embedded LM's tokenizer
trained on 4,000 reviews, the IMDB splits rebuilt and their tokenizer trained), and once with
a fixed runtime (--fixed-minutes), in rounds that alternate which goes first; each run in a
fresh copy of one folder where the rules before them (texts, the embedded LM, data, tokenizer)
ran once, locally, so only the measured jobs go to SLURM.

Per job it reads the seconds from the SLURM job's start (sacct's Start, whole seconds) to its
step's first line (the `started` time of the job record, results/<family>/jobs/...record.json,
written as the step begins: after the in-job Snakemake, srun and the step's imports). It
prints per rule and over all jobs the median, range and every value, auto and fixed, their
difference, and the wall time of each whole run (the submitting Snakemake evaluates the auto
limits too). --jobs 1 (the default) runs one job at a time, so jobs do not slow each other
on a small machine.

The cluster: one that answers is used and left running; otherwise this starts it as the test
suite does (tests/slurm/cluster.py up: root, and apt-get where SLURM is missing), registered as
one of its users (tests/slurm/fixtures.py), and stops it at the end unless a test session
still uses it. --checkout PATH benchmarks another checkout's code (its src/ first on
PYTHONPATH, in the jobs too; its Snakefile, profiles and site file), so code before and after
a change is measured by the same script.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import fcntl
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(HERE))
from tests.slurm import cluster  # noqa: E402 (this checkout's test cluster)

# the GPU rules measured, as 1-GPU jobs: one CPU each (the cluster runs on a small machine)
GPU_RULES = {
    "fluency_perplexity": ("fluency", {"gpu": 1, "cpus_per_gpu": 1, "mem_mb": 3000}),
    "scaling_train": ("scaling", {"gpu": 1, "cpus_per_gpu": 1, "mem_mb": 3000}),
}
TARGETS = [
    "results/fluency/perplexity/shard~0.csv",
    "results/fluency/perplexity/shard~1.csv",
    "results/scaling/runs/imdb/nodes~1/world~1/run.json",
]
CONFIG = "bench-config.yaml"
PREPARED = ".prepared"  # in the base folder: the commit and config it was prepared with
CASES = ("auto", "fixed")
# the test suite's cluster users and locks (tests/slurm/fixtures.py)
USERS = Path(f"{cluster.STATE}.users")
LIFECYCLE_LOCK = Path(f"{cluster.STATE}.lifecycle.lock")
USE_LOCK = Path(f"{cluster.STATE}.use.lock")
TURNSTILE = Path(f"{cluster.STATE}.turnstile.lock")


def main() -> None:
    """Prepare the inputs once, run the rounds on the cluster, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of an auto and a fixed run")
    parser.add_argument("--checkout", type=Path, default=HERE, help="checkout to benchmark")
    parser.add_argument("--jobs", type=int, default=1, help="SLURM jobs at once (default 1)")
    parser.add_argument(
        "--fixed-minutes", type=int, default=30, help="runtime of the GPU rules in the fixed case"
    )
    parser.add_argument("--keep", type=Path, help="folder for the runs, kept (default: temporary)")
    parser.add_argument("--save-record", type=Path, metavar="PATH", help="write figures as JSON")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    checkout = args.checkout.resolve()
    work = args.keep.resolve() if args.keep else Path(tempfile.mkdtemp(prefix="job-start-"))
    work.mkdir(parents=True, exist_ok=True)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("GPUFLOW_")},
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(checkout / "src"),
        "GPUFLOW_SLURM_SITE": str(checkout / "tests" / "slurm" / "site.yaml"),
        "OMP_NUM_THREADS": "1",
    }
    configs = {case: bench_config(checkout, case, args.fixed_minutes) for case in CASES}
    jobs: dict[str, list[dict[str, Any]]] = {case: [] for case in CASES}
    walls: dict[str, list[float]] = {case: [] for case in CASES}
    try:
        base = prepare(work / "base", checkout, configs["fixed"], env)
        with test_cluster():
            print(f"checkout {checkout} at {commit_of(checkout)}; runs in {work}", flush=True)
            for index in range(args.rounds):
                for case in CASES if index % 2 == 0 else reversed(CASES):
                    folder = work / f"round{index + 1}-{case}"
                    shutil.rmtree(folder, ignore_errors=True)
                    shutil.copytree(base, folder, symlinks=True)
                    wall = run_on_cluster(folder, checkout, configs[case], args.jobs, env)
                    found = job_starts(folder)
                    walls[case].append(wall)
                    jobs[case].extend(found)
                    delays = ", ".join(f"{job['rule']} {job['delay_s']:.1f} s" for job in found)
                    print(f"round {index + 1} {case}: run {wall:.1f} s; {delays}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    report(jobs, walls, args.rounds, args.jobs)
    if args.save_record:
        record = {
            "benchmark": "slurm-job-start",
            "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "commit": commit_of(checkout),
            "benchmark_commit": commit_of(HERE),
            "rounds": args.rounds,
            "jobs_at_once": args.jobs,
            "fixed_minutes": args.fixed_minutes,
            "load_average": os.getloadavg(),
            "jobs": jobs,
            "run_wall_s": walls,
        }
        args.save_record.parent.mkdir(parents=True, exist_ok=True)
        args.save_record.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        print(f"record: {args.save_record}")


def bench_config(checkout: Path, case: str, fixed_minutes: int) -> dict[str, Any]:
    """config/config.yaml of `checkout` (the embedded default size) with fluency and scaling
    only, IMDB on one process for one epoch, and the GPU rules as 1-GPU jobs whose runtime is
    `auto` or `fixed_minutes`."""
    path = checkout / "config" / "config.yaml"
    config = copy.deepcopy(yaml.safe_load(path.read_text(encoding="utf-8")))
    config["families"] = ["fluency", "scaling"]
    # the embedded LM trains 50 steps, not 500 (its time only: the work model of a perplexity
    # job trains the LM's tokenizer, on the default's texts and vocabulary)
    config["fluency"]["lm"]["train"]["steps"] = 50
    scaling = config["scaling"]
    scaling.update(run=["imdb"], world_sizes=[1], warmup_epochs=0)
    scaling["configurations"]["imdb"]["train"]["epochs"] = 1
    for rule, (family, resources) in GPU_RULES.items():
        runtime = "auto" if case == "auto" else fixed_minutes
        config[family].setdefault("resources", {})[rule] = {**resources, "runtime": runtime}
    return config


def snakemake_args(folder: Path, checkout: Path, config: dict[str, Any]) -> list[str]:
    """Snakemake with the Snakefile, folder and targets of a run (the config is written into
    `folder`; its --configfile goes last, as it takes every word that follows)."""
    (folder / CONFIG).write_text(yaml.safe_dump(config), encoding="utf-8")
    return [
        str(BIN / "snakemake"),
        "--snakefile",
        str(checkout / "Snakefile"),
        "--directory",
        str(folder),
        *TARGETS,
    ]


def prepare(folder: Path, checkout: Path, config: dict[str, Any], env: dict[str, str]) -> Path:
    """Run every rule the measured jobs need, locally, once (not the measured ones); a folder
    that an earlier run (--keep) prepared with the same code and config is reused."""
    commit = commit_of(checkout)  # a dirty checkout's code may differ: prepared afresh
    stamp = json.dumps({"commit": commit, "config": config}, sort_keys=True)
    done = folder / PREPARED
    if not commit.endswith("+dirty") and done.is_file() and done.read_text() == stamp:
        print(f"reusing the rules before the GPU jobs in {folder}", flush=True)
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    print(f"running the rules before the GPU jobs locally in {folder}", flush=True)
    command = [
        *snakemake_args(folder, checkout, config),
        "--cores",
        "2",
        "--omit-from",
        *GPU_RULES,
        "--configfile",
        str(folder / CONFIG),
    ]
    local_env = {k: v for k, v in env.items() if k != "GPUFLOW_SLURM_SITE"}
    checked(command, checkout, local_env)
    (folder / PREPARED).write_text(stamp, encoding="utf-8")
    return folder


def run_on_cluster(
    folder: Path, checkout: Path, config: dict[str, Any], jobs: int, env: dict[str, str]
) -> float:
    """Run the measured jobs through the SLURM profile; the run's wall seconds."""
    command = [
        *snakemake_args(folder, checkout, config),
        "--profile",
        str(checkout / "profiles" / "slurm"),
        "--profile",
        str(checkout / "tests" / "slurm" / "profile"),
        "--jobs",
        str(jobs),
        "--configfile",
        str(folder / CONFIG),
    ]
    started = time.perf_counter()
    checked(command, checkout, env)
    return time.perf_counter() - started


def checked(command: list[str], folder: Path, env: dict[str, str]) -> None:
    """Run `command` in `folder`; on failure print its output's end and stop."""
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(
            f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout[-2000:]}\n"
            f"{done.stderr[-6000:]}"
        )


def job_starts(folder: Path) -> list[dict[str, Any]]:
    """Each SLURM job's record of the run in `folder`: rule, first output, SLURM job id, sacct's
    start and the step's start; `delay_s` between them."""
    records = []
    for path in sorted((folder / "results").glob("*/jobs/**/*.record.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        if record.get("slurm_job_id"):
            records.append(record)
    ids = [str(record["slurm_job_id"]) for record in records]
    starts = sacct_starts(ids)
    found = []
    for record in records:
        start = starts[str(record["slurm_job_id"])]
        found.append(
            {
                "rule": rule_of(record),
                "output": record["outputs"][0],
                "slurm_job_id": str(record["slurm_job_id"]),
                "slurm_start": start,
                "step_started": record["started"],
                "delay_s": round(record["started"] - start, 2),
            }
        )
    return found


def rule_of(record: dict[str, Any]) -> str:
    """The measured rule a job record belongs to (by its step's first output)."""
    output = record["outputs"][0]
    return "fluency_perplexity" if "/perplexity/" in output else "scaling_train"


def sacct_starts(ids: list[str], timeout: float = 60.0) -> dict[str, float]:
    """sacct's start of each job (seconds since the epoch), waiting for slurmdbd to have it."""
    deadline = time.monotonic() + timeout
    while True:
        listed = subprocess.run(
            ["sacct", "-X", "--noheader", "--parsable2", "-j", ",".join(ids),
             "--format=JobIDRaw,Start"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        starts = {}
        for line in listed.splitlines():
            job, start = line.split("|")
            try:
                starts[job] = datetime.datetime.fromisoformat(start).timestamp()
            except ValueError:
                continue
        if all(job in starts for job in ids) or time.monotonic() > deadline:
            missing = [job for job in ids if job not in starts]
            if missing:
                raise SystemExit(f"sacct has no start of jobs {missing}")
            return starts
        time.sleep(1)


@contextmanager
def locked(path: Path, mode: int) -> Iterator[None]:
    """Hold `path`'s flock in `mode` for the block (as tests/slurm/fixtures.py)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, mode)
        yield


def users() -> list[Path]:
    """The test cluster's live users (as tests/slurm/fixtures.py counts them)."""
    USERS.mkdir(parents=True, exist_ok=True)
    found = []
    for user in USERS.iterdir():
        try:
            alive = user.name.isdigit() and (os.kill(int(user.name), 0) or True)
        except ProcessLookupError:
            alive = False
        except PermissionError:
            alive = True
        if alive:
            found.append(user)
        else:
            user.unlink(missing_ok=True)
    return found


@contextmanager
def test_cluster() -> Iterator[None]:
    """The test cluster for the block. One that test sessions use (tests/slurm/fixtures.py):
    this joins them as a user, and the last user stops it. One started by hand that answers:
    used and left running. None: started here (tests/slurm/cluster.py up) as its first user,
    stopped at the end unless a test session still uses it. The block holds the shared use
    lock, so a test module that needs the cluster alone waits for the benchmark."""
    me = USERS / str(os.getpid())
    with locked(LIFECYCLE_LOCK, fcntl.LOCK_EX):
        joined = bool(users()) or not answers()
        if not users() and not answers():
            print("starting the test cluster (tests/slurm/cluster.py up)", flush=True)
            cluster.up()
        if joined:
            me.touch()
    try:
        with USE_LOCK.open("a") as use:
            with locked(TURNSTILE, fcntl.LOCK_EX):
                fcntl.flock(use, fcntl.LOCK_SH)
            yield
    finally:
        if joined:
            with locked(LIFECYCLE_LOCK, fcntl.LOCK_EX):
                me.unlink(missing_ok=True)
                if not users():
                    print("stopping the test cluster (tests/slurm/cluster.py down)", flush=True)
                    cluster.down()


def answers() -> bool:
    """Whether a test cluster answers (SLURM's clients may not be installed yet)."""
    return bool(shutil.which("scontrol")) and cluster.answers()


def spread(values: list[float]) -> str:
    """Median (range) and every value."""
    if not values:
        return "-"
    every = ", ".join(f"{value:.1f}" for value in values)
    return (
        f"median {statistics.median(values):6.2f} s ({min(values):.1f}-{max(values):.1f}) [{every}]"
    )


def report(
    jobs: dict[str, list[dict[str, Any]]], walls: dict[str, list[float]], rounds: int, at_once: int
) -> None:
    """Per rule and over all jobs: seconds from the SLURM start to the step's first line."""
    print(
        f"\n{rounds} rounds of an auto and a fixed run (order alternating), {at_once} job(s) at "
        f"once; load average {os.getloadavg()[0]:.2f}"
    )
    print("seconds from the SLURM job's start (sacct) to the step's first line (job record):")
    for rule in [*GPU_RULES, "all GPU jobs"]:
        medians = {}
        for case in CASES:
            delays = [
                j["delay_s"] for j in jobs[case] if rule.startswith("all") or j["rule"] == rule
            ]
            medians[case] = statistics.median(delays) if delays else float("nan")
            print(f"  {rule:20} {case:6} {spread(delays)}")
        print(f"  {rule:20} auto - fixed: {medians['auto'] - medians['fixed']:+.2f} s (medians)")
    for case in CASES:
        print(f"  {'whole run':20} {case:6} {spread(walls[case])}")


def commit_of(checkout: Path) -> str:
    """The checkout's commit, with +dirty when tracked files differ from it."""
    git = ["git", "-C", str(checkout)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    )
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


if __name__ == "__main__":
    main()
