"""Operator tools' wall time: `gpuflow plan` against a plain dry run, and `gpuflow status`.

Usage: python benchmarks/plan_vs_dryrun.py [--runs 5] [--configfile config/paper.yaml]

Run from the repository root. Pairs `gpuflow plan --configfile C` with
`snakemake -n --quiet --configfile C` (same workflow, same profile, same folder), alternating
which goes first, and prints the median wall time of each, the median of the per-pair ratios
(goal <= 1.5) and the ratio of the medians; then the median wall time of `gpuflow status` on
the embedded config (config/config.yaml; goal <= 3 s on a quiet machine). Beside each median
wall time, the median CPU time (user + system) the command used: on a busy machine, where wall
times stretch with the load, it says what a quiet machine's wall time would be close to.
Outputs go to /dev/null; each command must succeed.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def timed(command: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds `command` takes, its output discarded; it must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def main() -> None:
    """Print the paired plan/dry-run times and ratio, then the status time."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="pairs (and status runs) to time")
    parser.add_argument("--configfile", default="config/paper.yaml", help="config to plan")
    args = parser.parse_args()
    plan = [str(BIN / "gpuflow"), "plan", "--configfile", args.configfile]
    dry_run = [str(BIN / "snakemake"), "-n", "--quiet", "--configfile", args.configfile]
    status = [str(BIN / "gpuflow"), "status"]
    timed(dry_run)  # warm the file cache and Snakemake's source cache once, untimed
    plans, dry_runs = [], []
    for index in range(args.runs):
        first, second = (plan, dry_run) if index % 2 == 0 else (dry_run, plan)
        times = {id(first): timed(first), id(second): timed(second)}
        plans.append(times[id(plan)])
        dry_runs.append(times[id(dry_run)])
    ratios = [p[0] / d[0] for p, d in zip(plans, dry_runs, strict=True)]
    statuses = [timed(status) for _ in range(args.runs)]
    median = statistics.median
    print(f"{args.runs} paired runs, {args.configfile}, alternating which goes first")
    print(f"gpuflow plan               {line(plans)}")
    print(f"snakemake -n --quiet       {line(dry_runs)}")
    print(
        f"plan / dry run             median of pair ratios {median(ratios):.2f}x, ratio of "
        f"medians {median(w for w, _ in plans) / median(w for w, _ in dry_runs):.2f}x "
        "(goal <= 1.5x)"
    )
    print(f"gpuflow status (embedded)  {line(statuses)} (goal <= 3 s)")


def line(times: list[tuple[float, float]]) -> str:
    """Median wall and CPU seconds, then every wall time."""
    walls = [wall for wall, _ in times]
    cpu = statistics.median(cpu for _, cpu in times)
    every = ", ".join(f"{wall:.2f}" for wall in walls)
    return f"median {statistics.median(walls):5.2f} s wall, {cpu:5.2f} s CPU  [{every}]"


if __name__ == "__main__":
    main()
