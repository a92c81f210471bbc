"""Seeds per second of one sweep shard with 1 and 2 CPU workers, and the speedup.

Runs the real `gpuflow sweep-shard` process (start-up, worker spawn, progress file and all) on
guess-and-check seeds whose threshold cannot be reached, so every seed does the same fixed work
(`--guesses` guesses). The baseline is the 1-worker run measured in the same invocation.

    PYTHONPATH=src python benchmarks/sweep.py [--seeds 32] [--guesses 800000]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GPUFLOW = [sys.executable, "-m", "gpuflow"]


def run_shard(workdir: Path, workers: int, seeds: int, guesses: int) -> dict[str, float]:
    """Run one shard; return end-to-end wall time and the summed per-seed compute time."""
    out = workdir / f"workers~{workers}" / "shard~0.csv"
    settings = {
        "data": {"seed": 0, "input_dim": 8, "output_dim": 8, "n_train": 4, "label_noise": 0.0},
        "gnc": {"loss_threshold": 1e-12, "max_guesses": guesses, "batch_size": 8192},
    }
    command = [
        *GPUFLOW,
        "sweep-shard",
        "--method=gnc",
        "--teacher-rank=2",
        "--student-width=8",
        f"--seeds=0:{seeds}",
        f"--settings={json.dumps(settings)}",
        f"--runtime={json.dumps({'device': 'cpu', 'cpu_workers': workers})}",
        f"--out={out}",
        f"--run-out={out.with_suffix('.run.json')}",
    ]
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    wall = time.perf_counter() - start
    with open(out, newline="") as handle:
        compute = sum(float(row["wall_s"]) for row in csv.DictReader(handle))
    return {"wall_s": wall, "compute_s": compute}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=32)
    parser.add_argument("--guesses", type=int, default=800000, help="work per seed")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    workdir = Path(tempfile.mkdtemp(prefix="gpuflow-sweep-bench-"))
    try:
        results = {w: run_shard(workdir, w, args.seeds, args.guesses) for w in (1, 2)}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"sweep shard: {args.seeds} G&C seeds x {args.guesses} guesses, CPU, 1 thread/worker")
    print(f"load average before/after: {load_before:.1f}/{os.getloadavg()[0]:.1f} (quiet: < 1)")
    print(f"{'workers':>8} {'wall s':>8} {'seeds/s':>8} {'compute s/seed':>15}")
    for workers, result in results.items():
        rate = args.seeds / result["wall_s"]
        per_seed = result["compute_s"] / args.seeds
        print(f"{workers:>8} {result['wall_s']:>8.2f} {rate:>8.2f} {per_seed:>15.3f}")
    speedup = results[1]["wall_s"] / results[2]["wall_s"]
    print(f"speedup 2 workers vs 1: {speedup:.2f}x (target >= 1.7x on 2 idle cores)")


if __name__ == "__main__":
    main()
