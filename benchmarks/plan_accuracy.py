"""Predictions that hold: each job's expected time from `gpuflow plan` against the time it took.

Usage: python benchmarks/plan_accuracy.py [--folder DIR] [--cores 2] [--skip-run]
                                          [--configfile FILE ...] [--save-records]

1. This machine, the embedded default (or it with --configfile's files merged over it), in a
   fresh folder: `gpuflow calibrate` (into the folder's own records, so nothing measured
   earlier is used), the plan's expected time of every job (read in-process: work model x the
   calibrated rates, `w`), then the whole run (`snakemake --cores 2`, as `make run`; with
   `--resources gpu=N` where this machine has N GPUs, `--keep-going`: where a job fails, the
   jobs that finished are still compared and the rates saved, and it exits 1), then every
   job's benchmark file against its prediction. Per rule: the median of predicted / actual
   over its jobs, with its range; goal: each family's main rules within +-35%. Beside it the
   baseline, the plan before this change: the rule's runtime limit. On a GPU node, `make
   gpu-pilot` runs this with config/pilot.yaml (one job per GPU family at the paper's model
   sizes) and --save-records: the node's calibrated rates and this comparison go to
   benchmarks/records/.
2. The H100, from the committed records: the Kingma M2 job (config/kingma.yaml at 100 labels,
   alpha 5000, 150 epochs: 248.9 s) and one paper grid point (100 labels, 75 epochs: 121.6 s)
   predicted from the committed rates alone (`make gpu-check`'s and the H100 node's calibration):
   the timings records, which hold these two jobs, are left out (no whole-job rate, no benchmark).
   Goal: +-25%.

Run from the repository root; part 1 takes about 7 minutes on 2 cores (calibration 1, run 6).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gpuflow.cost.benchmarks import benchmark_seconds
from gpuflow.cost.expected import Expected
from gpuflow.cost.models import planned_work
from gpuflow.cost.predict import Prediction, predict
from gpuflow.cost.rates import HOST_KINDS, RateBook, books
from gpuflow.ops.calibrate import RATES_SUFFIX
from gpuflow.ops.plan import plan_jobs, run_folder, stand_in_notes
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
GOAL, H100_GOAL = 0.35, 0.25


def run(command: list[str], folder: Path, check: bool = True) -> tuple[float, int]:
    """(wall seconds, exit status) of `command` run in `folder` (with `check`, it must succeed;
    its output to a log), with this venv first on PATH: the workflow's rules call `gpuflow` by
    name."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    started = time.perf_counter()
    with open(folder / f"{Path(command[0]).name}.log", "a") as log:
        done = subprocess.run(
            command, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT, check=check
        )
    return time.perf_counter() - started, done.returncode


def workflow_args(folder: Path, configs: list[str]) -> argparse.Namespace:
    return argparse.Namespace(
        directory=str(folder), profile=[], snakefile=str(REPO / "Snakefile"),
        configfile=configs, targets=[],
    )  # fmt: skip


def this_machine(
    folder: Path, cores: int, skip_run: bool, overlays: list[str]
) -> tuple[bool, dict[str, Any]]:
    """Calibrate, predict, run and compare: (every main rule met the goal, rows by rule)."""
    import torch

    records = folder / "records"
    options = ["--snakefile", str(REPO / "Snakefile"), "--directory", str(folder)]
    configs = [str(REPO / "config" / "config.yaml"), *(str(Path(f).resolve()) for f in overlays)]
    config = ["--configfile", *configs]
    gpus = torch.cuda.device_count()
    resources = ["--resources", f"gpu={gpus}"] if gpus else []
    if not skip_run:
        took, _ = run(
            [str(BIN / "gpuflow"), "calibrate", *options, "--out", str(records), *config], folder
        )
        print(f"gpuflow calibrate: {took:.0f} s")
    args = workflow_args(folder, configs)
    dag = plan_jobs(args, every_job=True)
    with run_folder(args):
        expected = Expected(dag.config, [], str(records))  # as before the run
        predicted = {j.benchmark: (j, expected.predict(j)) for j in dag.jobs if j.benchmark}
    failed = 0
    if not skip_run:
        command = [str(BIN / "snakemake"), *options, *config, "--cores", str(cores), *resources]
        took, failed = run([*command, "--keep-going"], folder, check=False)
        print(f"snakemake --cores {cores}: {took:.0f} s")
        if failed:
            print(
                f"snakemake failed (exit {failed}; {folder / 'snakemake.log'} names the jobs):"
                " the jobs that finished are compared, the rates are kept"
            )
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
    ok = not failed
    rows = {}
    for family, rules in MAIN_RULES.items():
        for rule in rules:
            found = by_rule.get(rule, [])
            if not found:
                continue
            ratios = [guess / actual for guess, actual, _, _ in found]
            middle = statistics.median(ratios)
            old = statistics.median(limit / actual for _, actual, limit, _ in found)
            met = abs(middle - 1) <= GOAL
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
        return False, rows
    main = [
        found for rules in MAIN_RULES.values() for rule in rules for found in by_rule.get(rule, [])
    ]
    total, spent = sum(g for g, *_ in main), sum(a for _, a, *_ in main)
    limits = sum(limit for *_, limit, _ in main)
    print(
        f"\nthe {len(main)} jobs of these rules: predicted {total:.0f} s, actual {spent:.0f} s"
        f" ({total / spent:.2f}x); the old plan's limits {limits:.0f} s ({limits / spent:.0f}x)."
        f" Goal: each main rule's median within +-{GOAL:.0%}."
    )
    return ok, rows


def h100_part(host_records: Path) -> tuple[bool, list[dict[str, Any]]]:
    """The two measured H100 jobs predicted from the committed rates alone; then, where they
    differ, with the host rates (start-ups, state writes) this machine's calibration just
    measured: the H100 host's own only where this machine is an H100 node (the committed ones
    are the H100 node's of 2026-11-27). (goal met, a row per job)."""
    _, gpu = books(RECORDS, "h100", whole_jobs=False)
    cpu, node = books(host_records, whole_jobs=False)
    measured = node if node.device else cpu  # a GPU node's calibration is named by its GPU
    hosted = [rate for rate in measured.rates if rate.kind in HOST_KINDS]
    host = RateBook(gpu.device, [*gpu.rates, *hosted])
    kingma = json.loads((RECORDS / "2026-11-26-nvidia-h100-80gb-hbm3-kingma.json").read_text())
    timings = json.loads((RECORDS / "2026-11-26-nvidia-h100-80gb-hbm3-timings.json").read_text())
    point = "results/ssvae/benchmarks/train/frac~0.002/corrupt~0.0/alpha~1.tsv"
    measured_s = {row["path"]: row["job"]["seconds"] for row in timings["rows"]}
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
            measured_s[point],
        ),
    ]
    print(f"\nH100 ({gpu.device}), from the committed rates alone:")
    ok, rows = True, []
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
        rests = [
            ", ".join(guess.basis),
            *guess.notes,
            *stand_in_notes([asdict(s) for s in guess.stand_ins]),
        ]
        print(
            f"  {name}: predicted {guess.seconds:.1f} s, measured {actual:.1f} s: {error:+.1%}"
            f" ({'ok' if abs(error) <= H100_GOAL else 'MISS'}; goal +-{H100_GOAL:.0%})\n"
            f"    work: {terms}\n    rests on: {'; '.join(rests)}"
        )
        row = {"job": name, "measured_s": actual, "predicted_s": guess.seconds, "error": error}
        borrowed = predict(work, host)
        if isinstance(borrowed, Prediction) and borrowed.seconds != guess.seconds:
            print(
                f"    with the start-up and state-write rates of {measured.device} in their place:"
                f" {borrowed.seconds:.1f} s, {borrowed.seconds / actual - 1:+.1%}"
            )
            row |= {"host_rates_of": measured.device, "with_host_rates_s": borrowed.seconds}
        rows.append(row)
    return ok, rows


def save_records(folder: Path, summary: dict[str, Any]) -> None:
    """Copy the calibration's rates records into benchmarks/records/ and write the comparison
    beside the last, a GPU's where there is one (a CPU's name sorts first), as
    <date>-<device>-pilot.json."""
    found = sorted((folder / "records").glob(f"*{RATES_SUFFIX}.json"))
    for rates in found:
        shutil.copy2(rates, RECORDS / rates.name)
        print(f"saved {RECORDS / rates.name}")
    if found:
        pilot = RECORDS / found[-1].name.replace(f"{RATES_SUFFIX}.json", "-pilot.json")
        pilot.write_text(json.dumps(summary, indent=2) + "\n")
        print(f"saved {pilot}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--folder", default=None, help="the fresh run folder (default: a new temporary one)"
    )
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--skip-run", action="store_true", help="compare a folder that ran already")
    parser.add_argument(
        "--configfile", nargs="*", default=[], help="config files merged over config/config.yaml"
    )
    parser.add_argument(
        "--save-records",
        action="store_true",
        help="copy the calibrated rates and this comparison into benchmarks/records/",
    )
    args = parser.parse_args()
    folder = Path(args.folder or tempfile.mkdtemp(prefix="plan-accuracy-"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"folder: {folder}")
    machine_ok, rules = this_machine(folder, args.cores, args.skip_run, args.configfile)
    h100_ok, h100 = h100_part(folder / "records")
    summary = {
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "configfiles": ["config/config.yaml", *args.configfile],
        "rules": rules,
        "h100_retrodiction": h100,
    }
    (folder / "plan_accuracy.json").write_text(json.dumps(summary, indent=2) + "\n")
    if args.save_records:
        save_records(folder, summary)
    return 0 if machine_ok and h100_ok else 1


if __name__ == "__main__":
    sys.exit(main())
