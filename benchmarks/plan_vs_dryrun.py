"""Operator tools' wall time: `gpuflow plan` against a plain dry run, and `gpuflow status`.

Usage: python benchmarks/plan_vs_dryrun.py [--runs 5] [--configfile config/paper.yaml]

Run from the repository root. Pairs `gpuflow plan --configfile C` with
`snakemake -n --quiet --configfile C` (same workflow, same profile, same folder), alternating
which goes first, and prints the median wall time of each, the median of the per-pair ratios
(goal <= 1.5) and the ratio of the medians; then the median wall time of `gpuflow status` on
the embedded config (config/config.yaml; goal <= 3 s on a quiet machine). Outputs go to
/dev/null; each command must succeed.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def wall_s(command: list[str]) -> float:
    """Seconds `command` takes, its output discarded; it must succeed."""
    started = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def main() -> None:
    """Print the paired plan/dry-run times and ratio, then the status time."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="pairs (and status runs) to time")
    parser.add_argument("--configfile", default="config/paper.yaml", help="config to plan")
    args = parser.parse_args()
    plan = [str(BIN / "gpuflow"), "plan", "--configfile", args.configfile]
    dry_run = [str(BIN / "snakemake"), "-n", "--quiet", "--configfile", args.configfile]
    status = [str(BIN / "gpuflow"), "status"]
    wall_s(dry_run)  # warm the file cache and Snakemake's source cache once, untimed
    plans, dry_runs = [], []
    for index in range(args.runs):
        first, second = (plan, dry_run) if index % 2 == 0 else (dry_run, plan)
        times = {id(first): wall_s(first), id(second): wall_s(second)}
        plans.append(times[id(plan)])
        dry_runs.append(times[id(dry_run)])
    ratios = [p / d for p, d in zip(plans, dry_runs, strict=True)]
    statuses = [wall_s(status) for _ in range(args.runs)]
    median = statistics.median
    print(f"{args.runs} paired runs, {args.configfile}, alternating which goes first")
    print(f"gpuflow plan               median {median(plans):6.2f} s  {fmt(plans)}")
    print(f"snakemake -n --quiet       median {median(dry_runs):6.2f} s  {fmt(dry_runs)}")
    print(
        f"plan / dry run             median of pair ratios {median(ratios):.2f}x, "
        f"ratio of medians {median(plans) / median(dry_runs):.2f}x (goal <= 1.5x)"
    )
    print(f"gpuflow status (embedded)  median {median(statuses):6.2f} s  {fmt(statuses)}")


def fmt(values: list[float]) -> str:
    return "[" + ", ".join(f"{value:.2f}" for value in values) + "]"


if __name__ == "__main__":
    main()
