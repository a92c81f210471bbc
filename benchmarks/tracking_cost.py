"""What the experiment tracker costs: the training rules with `telemetry.tracker` on against off.

Usage: python benchmarks/tracking_cost.py [--rounds 3] [--config .test/all/config.yaml]

One run of the config prepares every training input (tracker off). Each trial copies that folder
and runs the training rules again (`--forcerun`, `--until`: fluency_train_lm, ssvae_train,
ssvae_baseline, scaling_train, sweep_shard) with the tracker off or on. Rounds interleave the two
arms, in alternating order (off, on / on, off, ...), so a machine's drift falls on both. Each arm
prints the median and the range of the run's wall time and of its jobs' summed seconds (their
`benchmark:` files), and the ratio on / off of the medians.

Measured (2 cores shared with other work, 2 rounds): run 144.1 s [134.5-153.7] off, 149.1 s
[135.3-162.8] on, 1.034x; jobs' seconds 193.1 s off, 230.0 s on, 1.191x (docs/tracking.md).
With `--config config/config.yaml` (`make run`'s 29 training jobs; idle machine, 2 rounds): run
494.8 s off, 551.6 s on, 1.115x; jobs' seconds 727.2 s off, 811.9 s on, 1.117x.
"""

from __future__ import annotations

import argparse
import copy
import csv
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TRAINING_RULES = (
    "fluency_train_lm",
    "ssvae_train",
    "ssvae_baseline",
    "scaling_train",
    "sweep_shard",
)


def snakemake(workdir: Path, config: dict, *args: str) -> None:
    """The repository's workflow in `workdir` with `config` (over the schema's defaults)."""
    configfile = workdir / "bench-config.yaml"
    configfile.write_text(yaml.safe_dump(config), encoding="utf-8")
    command = [str(BIN / "snakemake"), "--snakefile", str(REPO / "Snakefile")]
    command += ["--directory", str(workdir), "--configfile", str(configfile), "--cores", "2"]
    env = {**os.environ, "PATH": os.pathsep.join([str(BIN), os.environ.get("PATH", "")])}
    result = subprocess.run([*command, *args], capture_output=True, text=True, check=False, env=env)
    if result.returncode != 0:
        sys.exit(f"snakemake failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")


def with_tracker(config: dict, on: bool) -> dict:
    changed = copy.deepcopy(config)
    changed["telemetry"] = {
        **changed.get("telemetry", {}),
        "tracker": "tensorboard" if on else "none",
    }
    return changed


def job_seconds(workdir: Path, since: float) -> float:
    """Wall seconds of every job that ran since `since`, from the rules' benchmark files."""
    total = 0.0
    for path in (workdir / "results").rglob("benchmarks/**/*.tsv"):
        if path.stat().st_mtime >= since:
            with path.open(encoding="utf-8") as handle:
                total += sum(float(row["s"]) for row in csv.DictReader(handle, delimiter="\t"))
    return total


def trial(base: Path, scratch: Path, config: dict, on: bool) -> tuple[float, float]:
    """(run wall seconds, summed job seconds) of the training rules on a copy of `base`."""
    workdir = scratch / f"trial-{time.monotonic_ns()}"
    shutil.copytree(base, workdir, symlinks=True)
    started_at = time.time()
    started = time.monotonic()
    snakemake(
        workdir, with_tracker(config, on), "--forcerun", *TRAINING_RULES, "--until", *TRAINING_RULES
    )
    wall = time.monotonic() - started
    seconds = job_seconds(workdir, started_at)
    shutil.rmtree(workdir)
    return wall, seconds


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} s [{min(values):.1f}-{max(values):.1f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--config", type=Path, default=REPO / ".test" / "all" / "config.yaml")
    args = parser.parse_args()
    config = yaml.safe_load(args.config.read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory(prefix="tracking-cost-") as folder:
        scratch = Path(folder)
        base = scratch / "base"
        base.mkdir()
        snakemake(base, with_tracker(config, False), "--until", *TRAINING_RULES)
        times: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for round_ in range(args.rounds):
            order = (False, True) if round_ % 2 == 0 else (True, False)
            for on in order:
                times[on].append(trial(base, scratch, config, on))
                wall, seconds = times[on][-1]
                arm = "on " if on else "off"
                print(f"round {round_ + 1} tracker {arm}: run {wall:.1f} s, jobs {seconds:.1f} s")
    for on in (False, True):
        walls, jobs = zip(*times[on], strict=True)
        arm = "on " if on else "off"
        print(f"tracker {arm}: run {spread(list(walls))}, jobs {spread(list(jobs))}")
    for index, what in ((0, "run"), (1, "jobs")):
        ratio = statistics.median(t[index] for t in times[True]) / statistics.median(
            t[index] for t in times[False]
        )
        print(f"on / off ({what}): {ratio:.3f}")


if __name__ == "__main__":
    main()
