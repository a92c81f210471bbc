"""Predictions that hold: each job's expected time from `gpuflow plan` against the time it took.

Usage: python benchmarks/plan_accuracy.py [--folder DIR] [--cores 2] [--skip-run]

1. This CPU, the embedded default, in a fresh folder: `gpuflow calibrate` (into the folder's own
   records, so nothing measured earlier is used), the plan's expected time of every job (read
   in-process: work model x the calibrated rates, `w`), then the whole run (`snakemake --cores
   2`, as `make run`), then every job's benchmark file against its prediction. Per rule: the
   median of predicted / actual over its jobs, with its range; goal: each family's main rules
   within +-35%. Beside it the baseline, the plan before this change: the rule's runtime limit.
2. The H100, from the committed records: the Kingma M2 job (config/kingma.yaml at 100 labels,
   alpha 5000, 150 epochs: 248.9 s) and one paper grid point (100 labels, 75 epochs: 121.6 s)
   predicted from gpu-check's rates alone: the timings records, which hold these two jobs, are
   left out (no whole-job rate, no benchmark). Goal: +-25%.

Run from the repository root; part 1 takes about 7 minutes on 2 cores (calibration 1, run 6).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpuflow.cost.expected import Expected
from gpuflow.cost.predict import Prediction, predict
from gpuflow.cost.rates import HOST_KINDS, RateBook, books
from gpuflow.cost.rules import planned_work
from gpuflow.ops.plan import plan_jobs
from gpuflow.ops.timings import benchmark_seconds
from gpuflow.settings.validate import load_config

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
RECORDS = REPO / "benchmarks" / "records"
MAIN_RULES = {
    "fluency": ("fluency_train_lm", "fluency_perplexity", "fluency_toxicity"),
    "ssvae": ("ssvae_train", "ssvae_baseline"),
    "scaling": ("scaling_train", "scaling_baseline"),
    "sweep": ("sweep_shard",),
}
CPU_GOAL, H100_GOAL = 0.35, 0.25


def run(command: list[str], folder: Path) -> float:
    """Wall seconds of `command` run in `folder` (it must succeed; its output to a log)."""
    started = time.perf_counter()
    with open(folder / f"{Path(command[0]).name}.log", "a") as log:
        subprocess.run(command, cwd=folder, stdout=log, stderr=subprocess.STDOUT, check=True)
    return time.perf_counter() - started


def workflow_args(folder: Path) -> argparse.Namespace:
    config = [str(REPO / "config" / "config.yaml")]
    return argparse.Namespace(
        directory=str(folder), profile=[], snakefile=str(REPO / "Snakefile"),
        configfile=config, targets=[],
    )  # fmt: skip


def cpu_part(folder: Path, cores: int, skip_run: bool) -> bool:
    """Calibrate, predict, run and compare; True where every main rule met the goal."""
    records = folder / "records"
    options = ["--snakefile", str(REPO / "Snakefile"), "--directory", str(folder)]
    config = ["--configfile", str(REPO / "config" / "config.yaml")]
    if not skip_run:
        took = run(
            [str(BIN / "gpuflow"), "calibrate", *options, "--out", str(records), *config], folder
        )
        print(f"gpuflow calibrate: {took:.0f} s")
    dag = plan_jobs(workflow_args(folder), every_job=True)
    expected = Expected(dag, str(folder), str(records), own=False)  # as before the run
    predicted = {job.benchmark: (job, expected.predict(job)) for job in dag.jobs if job.benchmark}
    if not skip_run:
        took = run([str(BIN / "snakemake"), *options, *config, "--cores", str(cores)], folder)
        print(f"snakemake --cores {cores}: {took:.0f} s")
    by_rule: dict[str, list[tuple[float, float, float, str]]] = {}
    for path, (job, guess) in predicted.items():
        actual = benchmark_seconds(folder / path)
        if actual is not None:
            by_rule.setdefault(job.rule, []).append(
                (guess.seconds, actual, job.runtime_h * 3600, guess.source)
            )
    print(
        f"\n{'rule':22s} {'jobs':>4s} {'predicted':>9s} {'actual':>8s} {'src':>3s} "
        f"{'predicted/actual: median [range]':>33s} {'old plan/actual':>15s}"
    )
    ok = True
    rows = {}
    for family, rules in MAIN_RULES.items():
        for rule in rules:
            found = by_rule.get(rule, [])
            if not found:
                continue
            ratios = [guess / actual for guess, actual, _, _ in found]
            middle = statistics.median(ratios)
            old = statistics.median(limit / actual for _, actual, limit, _ in found)
            met = abs(middle - 1) <= CPU_GOAL
            ok &= met
            sources = "/".join(sorted({s for *_, s in found}))
            rows[rule] = {
                "family": family,
                "jobs": len(found),
                "median": middle,
                "low": min(ratios),
                "high": max(ratios),
            }
            print(
                f"{rule:22s} {len(found):>4d} {statistics.median(g for g, *_ in found):8.1f}s "
                f"{statistics.median(a for _, a, *_ in found):7.1f}s {sources:>3s} "
                f"{middle:>14.2f} [{min(ratios):.2f}-{max(ratios):.2f}] "
                f"{'ok' if met else 'MISS':>5s} {old:>14.0f}x"
            )
    if not by_rule:
        print("no job of the folder has a benchmark file: nothing to compare")
        return False
    main = [
        found for rules in MAIN_RULES.values() for rule in rules for found in by_rule.get(rule, [])
    ]
    total, spent = sum(g for g, *_ in main), sum(a for _, a, *_ in main)
    limits = sum(limit for *_, limit, _ in main)
    print(
        f"\nthe {len(main)} jobs of these rules: predicted {total:.0f} s, actual {spent:.0f} s"
        f" ({total / spent:.2f}x); the old plan's limits {limits:.0f} s ({limits / spent:.0f}x)."
        f" Goal: each main rule's median within +-{CPU_GOAL:.0%}."
    )
    (folder / "plan_accuracy.json").write_text(json.dumps(rows, indent=2))
    return ok


def h100_part(host_records: Path) -> bool:
    """The two measured H100 jobs predicted from gpu-check's rates alone; then, as a diagnosis,
    with this machine's host rates (start-up, state writes: never measured on the H100) in place
    of the missing ones."""
    _, gpu = books(RECORDS, "h100", whole_jobs=False)
    cpu, _ = books(host_records, whole_jobs=False)
    host = RateBook(gpu.device, [*gpu.rates, *(r for r in cpu.rates if r.kind in HOST_KINDS)])
    kingma = json.loads((RECORDS / "2026-11-26-nvidia-h100-80gb-hbm3-kingma.json").read_text())
    timings = json.loads((RECORDS / "2026-11-26-nvidia-h100-80gb-hbm3-timings.json").read_text())
    point = "results/ssvae/benchmarks/train/frac~0.002/corrupt~0.0/alpha~1.tsv"
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as row150:
        row150.write("ssvae: {grid: {fractions: [0.002], alphas: [5000]}, train: {epochs: 150}}\n")
        row150.flush()
        kingma_config = load_config(
            REPO / "config/config.yaml", REPO / "config/kingma.yaml", row150.name
        )
    paper = load_config(REPO / "config/config.yaml", REPO / "config/paper.yaml")
    jobs = [
        (
            "Kingma M2, 100 labels, 150 epochs",
            kingma_config,
            "5000",
            kingma["job_seconds"]["ssvae_train"],
        ),
        (
            "paper grid point, 100 labels, 75 epochs",
            paper,
            "1",
            timings["benchmarks"][point]["seconds"],
        ),
    ]
    print(f"\nH100 ({gpu.device}), from gpu-check's rates alone:")
    ok = True
    for name, config, alpha, actual in jobs:
        work = planned_work(
            "ssvae_train", config, {"frac": "0.002", "corrupt": "0.0", "alpha": alpha}
        )
        guess = predict(work, gpu) if work else None
        if not isinstance(guess, Prediction):
            print(f"  {name}: no prediction ({guess})")
            ok = False
            continue
        error = guess.seconds / actual - 1
        ok &= abs(error) <= H100_GOAL
        terms = "; ".join(f"{t.what}" for t in work.terms if t.what)
        print(
            f"  {name}: predicted {guess.seconds:.1f} s, measured {actual:.1f} s: {error:+.1%}"
            f" ({'ok' if abs(error) <= H100_GOAL else 'MISS'}; goal +-{H100_GOAL:.0%})\n"
            f"    work: {terms}\n    rests on: {', '.join(guess.basis)}; {'; '.join(guess.notes)}"
        )
        borrowed = predict(work, host)
        if isinstance(borrowed, Prediction) and borrowed.seconds != guess.seconds:
            print(
                f"    with this machine's start-up and state-write rates in their place (not a"
                f" measurement of the H100's host): {borrowed.seconds:.1f} s,"
                f" {borrowed.seconds / actual - 1:+.1%}"
            )
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--folder", default=None, help="the fresh run folder (default: a new temporary one)"
    )
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--skip-run", action="store_true", help="compare a folder that ran already")
    args = parser.parse_args()
    folder = Path(args.folder or tempfile.mkdtemp(prefix="plan-accuracy-"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"folder: {folder}")
    cpu_ok = cpu_part(folder, args.cores, args.skip_run)
    h100_ok = h100_part(folder / "records")
    return 0 if cpu_ok and h100_ok else 1


if __name__ == "__main__":
    sys.exit(main())
