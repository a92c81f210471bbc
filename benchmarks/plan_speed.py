"""Planning speed at paper scale: `snakemake -n`, `gpuflow status` and `gpuflow plan`.

Usage: python benchmarks/plan_speed.py [--runs 5] [--keep DIR] [--checkout PATH]
                                       [--baseline PATH] [--fixed-minutes 240]
                                       [--save-record [PATH]]

Copies the checkout's tracked files (`git ls-files`, as they are in its working tree) into a
fresh folder, links in inputs of the paper's sizes (benchmarks/paper_inputs.py: aclImdb, AG
News, 20,000 generations, gpt2-large's config and tokenizer in a Hugging Face home of their
own) and writes `fixed.yaml`, a config overlay giving every rule whose resources in
config/paper.yaml say `runtime: auto` a fixed runtime (--fixed-minutes). Then, from inside the
copy, with HF_HOME set to the inputs' Hugging Face home, the checkout's src/ first on
PYTHONPATH and no GPUFLOW_* variable of the shell's (a site file, records), each with
`--profile profiles/slurm --configfile config/paper.yaml`, it times:

- `snakemake -n` with runtime auto: the first run of the fresh copy alone, reported as cold
  (caches in the copy are empty then; none outside it is cleared); then in every round
- (a) `snakemake -n` with runtime auto (not `--quiet`: a quiet dry run evaluates no
  resources, so it would hide what `runtime: auto` costs);
- (b) the same with `fixed.yaml` added;
- (c) `gpuflow status`;
- (d) `gpuflow plan`;

in rounds that run the four in turn, in the reverse order every other round. It prints per
command the median wall and CPU (user + system) seconds with their range and every value, then
the ratios against their goals: dry run auto / fixed <= 1.3x (median of the per-round ratios
and ratio of the medians), status <= 5 s, plan / dry run (auto) <= 1.5x. On a busy machine
wall times stretch with the load and CPU seconds much less; they can exceed the wall time (the
tokenizers that work models train use every core).

--keep DIR keeps the inputs in DIR/inputs (writing them takes about 25 s) and reuses them in
later runs; each run still makes a fresh copy of the checkout beside them. --checkout PATH
benchmarks another checkout's code (its tracked files, Snakefile and src/), so code before
and after a change is measured by the same script, with the same inputs under --keep.
--baseline PATH copies a second checkout (say `git worktree add /tmp/before HEAD~1`) beside
the first and times its `gpuflow status` in every round with the other four, then prints
status / baseline status: a change's effect, interleaved.
--save-record writes the figures as JSON (default benchmarks/records/<date>-<cpu>-plan-speed
.json; the name is not one of the ignored CPU patterns of .gitignore, and the record has no
`rows`, so gpuflow's rate and timings readers pass it by).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parents[1]  # this checkout: its paper_inputs.py writes inputs
BIN = Path(sys.executable).parent
PROFILE = "profiles/slurm"
CONFIG = "config/paper.yaml"
FIXED = "fixed.yaml"
DONE = ".written"  # in DIR/inputs once paper_inputs.py has finished there
GOALS = {"auto_vs_fixed": 1.3, "status_s": 5.0, "plan_vs_dry_run": 1.5}

Times = list[tuple[float, float]]


def main() -> None:
    """Copy the checkout, write or reuse the inputs, time the four commands and print them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="rounds of the four commands")
    parser.add_argument("--keep", type=Path, help="folder whose inputs/ to write once and reuse")
    parser.add_argument("--checkout", type=Path, default=HERE, help="checkout to benchmark")
    parser.add_argument(
        "--baseline", type=Path, help="another checkout whose `gpuflow status` runs beside"
    )
    parser.add_argument(
        "--fixed-minutes", type=int, default=240, help="runtime of the auto rules in fixed.yaml"
    )
    parser.add_argument(
        "--save-record",
        nargs="?",
        const="",
        default=None,
        metavar="PATH",
        help="write the figures as JSON (default benchmarks/records/<date>-<cpu>-plan-speed.json)",
    )
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    checkout = args.checkout.resolve()
    work = args.keep.resolve() if args.keep else Path(tempfile.mkdtemp(prefix="plan-speed-"))
    inputs = write_inputs(work / "inputs")
    copy = Path(tempfile.mkdtemp(prefix="copy-", dir=work))
    baseline = Path(tempfile.mkdtemp(prefix="baseline-", dir=work)) if args.baseline else None
    try:
        env = copied(checkout, copy, inputs)
        fixed_rules = write_fixed(copy / CONFIG, copy / FIXED, args.fixed_minutes)
        run = ["--profile", PROFILE, "--configfile", CONFIG]
        commands = {
            "dry_run_auto": [str(BIN / "snakemake"), "-n", *run],
            "dry_run_fixed": [str(BIN / "snakemake"), "-n", *run, FIXED],
            "status": [str(BIN / "gpuflow"), "status", *run],
            "plan": [str(BIN / "gpuflow"), "plan", *run],
        }
        places = dict.fromkeys(commands, (copy, env))
        if baseline:
            commands["status_baseline"] = commands["status"]
            places["status_baseline"] = (
                baseline,
                copied(args.baseline.resolve(), baseline, inputs),
            )
            print(f"baseline {args.baseline} at {commit_of(args.baseline)}", flush=True)
        load_before = os.getloadavg()
        print(f"checkout {checkout} at {commit_of(checkout)}; copy in {copy}", flush=True)
        print(f"fixed.yaml: {args.fixed_minutes} min for {', '.join(fixed_rules)}", flush=True)
        cold = timed(commands["dry_run_auto"], copy, env)
        print(f"cold dry run (auto): {cold[0]:.2f} s wall, {cold[1]:.2f} s CPU", flush=True)
        times: dict[str, Times] = {name: [] for name in commands}
        for index in range(args.runs):
            order = list(commands) if index % 2 == 0 else list(reversed(commands))
            for name in order:
                times[name].append(timed(commands[name], *places[name]))
            print(f"round {index + 1}: " + ", ".join(f"{n} {times[n][-1][0]:.1f} s" for n in order))
        load_after = os.getloadavg()
    finally:
        shutil.rmtree(copy, ignore_errors=True)
        if baseline:
            shutil.rmtree(baseline, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    ratios = report(times, cold, args.runs, load_before, load_after)
    if args.save_record is not None:
        path = Path(args.save_record) if args.save_record else default_record()
        record = {
            "benchmark": "plan-speed",
            "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "commit": commit_of(checkout),
            "baseline_commit": commit_of(args.baseline) if args.baseline else None,
            "benchmark_commit": commit_of(HERE),
            "profile": PROFILE,
            "configfile": CONFIG,
            "fixed_minutes": args.fixed_minutes,
            "fixed_rules": fixed_rules,
            "runs": args.runs,
            "load_average": {"before": load_before, "after": load_after},
            "commands": {
                name: " ".join(Path(c).name if i == 0 else c for i, c in enumerate(cmd))
                for name, cmd in commands.items()
            },
            "cold_dry_run_auto": {"wall_s": round(cold[0], 3), "cpu_s": round(cold[1], 3)},
            "times": {name: summary(values) for name, values in times.items()},
            "ratios": ratios,
            "goals": GOALS,
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        print(f"record: {path}")


def copied(checkout: Path, copy: Path, inputs: Path) -> dict[str, str]:
    """Copy `checkout` into `copy` with the inputs linked in; the environment to run its code."""
    copy_checkout(checkout, copy)
    link_tree(inputs / "data", copy / "data")
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("GPUFLOW_")},
        "HF_HOME": str(inputs / "hf"),
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(checkout / "src"), os.environ.get("PYTHONPATH")])
        ),
    }


def write_inputs(folder: Path) -> Path:
    """The paper's inputs in `folder` (data/ and hf/), written by paper_inputs.py unless an
    earlier run finished writing them there."""
    if not (folder / DONE).is_file():
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        print(f"writing the paper's inputs into {folder} (about 25 s)", flush=True)
        env = {**os.environ, "PYTHONPATH": str(HERE / "src")}
        script = HERE / "benchmarks" / "paper_inputs.py"
        command = [sys.executable, str(script), str(folder), "--hf-home", str(folder / "hf")]
        subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
        (folder / DONE).write_text("")
    return folder


def copy_checkout(checkout: Path, copy: Path) -> None:
    """The checkout's tracked files as its working tree has them (deleted ones left out)."""
    listed = subprocess.run(
        ["git", "-C", str(checkout), "ls-files", "-z"], capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = checkout / name
        if source.is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / name)


def link_tree(source: Path, target: Path) -> None:
    """Hard links to every file under `source` at the same place under `target`: the copy
    reads the inputs as its own files, and a fresh copy costs no new 200 MB."""
    for folder, _, files in os.walk(source):
        place = target / Path(folder).relative_to(source)
        place.mkdir(parents=True, exist_ok=True)
        for name in files:
            os.link(Path(folder) / name, place / name)


def write_fixed(config: Path, overlay: Path, minutes: int) -> list[str]:
    """Write the overlay that gives every `runtime: auto` rule of `config` a fixed runtime;
    the rules, in the config's order."""
    fixed: dict[str, Any] = {}
    rules: list[str] = []
    for family, section in (yaml.safe_load(config.read_text(encoding="utf-8")) or {}).items():
        blocks = section.get("resources") if isinstance(section, dict) else None
        for rule, block in (blocks or {}).items():
            if isinstance(block, dict) and block.get("runtime") == "auto":
                fixed.setdefault(family, {"resources": {}})["resources"][rule] = {
                    "runtime": minutes
                }
                rules.append(rule)
    if not rules:
        raise SystemExit(f"{config}: no rule asks for runtime: auto")
    overlay.write_text(yaml.safe_dump(fixed, sort_keys=False), encoding="utf-8")
    return rules


def timed(command: list[str], folder: Path, env: dict[str, str]) -> tuple[float, float]:
    """(wall, CPU) seconds `command` takes in `folder`; it must succeed (else its output's end
    is printed and the benchmark stops)."""
    with tempfile.TemporaryFile() as output:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        done = subprocess.run(command, cwd=folder, env=env, stdout=output, stderr=output)
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode:
            output.seek(0)
            tail = output.read().decode(errors="replace")[-3000:]
            raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{tail}")
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def summary(values: Times) -> dict[str, Any]:
    """Median, range and every value of the wall and CPU seconds."""
    walls, cpus = [w for w, _ in values], [c for _, c in values]
    return {
        "wall_s": [round(w, 3) for w in walls],
        "cpu_s": [round(c, 3) for c in cpus],
        "median_wall_s": round(statistics.median(walls), 3),
        "median_cpu_s": round(statistics.median(cpus), 3),
    }


def line(values: Times) -> str:
    """Median wall and CPU seconds with their range, then every wall and CPU value."""
    walls, cpus = [w for w, _ in values], [c for _, c in values]
    return (
        f"wall {statistics.median(walls):7.2f} s ({min(walls):.2f}-{max(walls):.2f}), "
        f"CPU {statistics.median(cpus):7.2f} s ({min(cpus):.2f}-{max(cpus):.2f})\n"
        f"{'':26}wall [{', '.join(f'{w:.2f}' for w in walls)}]\n"
        f"{'':26}CPU  [{', '.join(f'{c:.2f}' for c in cpus)}]"
    )


def ratio(top: Times, bottom: Times) -> dict[str, Any]:
    """Per-round wall ratios, their median, the ratio of the median walls, and the ratio of
    the median CPU seconds (less stretched by a busy machine)."""
    rounds = [t[0] / b[0] for t, b in zip(top, bottom, strict=True)]
    median = statistics.median
    return {
        "per_round": [round(r, 3) for r in rounds],
        "median_of_rounds": round(median(rounds), 3),
        "of_medians": round(median(w for w, _ in top) / median(w for w, _ in bottom), 3),
        "cpu_of_medians": round(median(c for _, c in top) / median(c for _, c in bottom), 3),
    }


def report(
    times: dict[str, Times],
    cold: tuple[float, float],
    runs: int,
    load_before: tuple[float, float, float],
    load_after: tuple[float, float, float],
) -> dict[str, Any]:
    """Print the table and the ratios against their goals; return the ratios."""
    print(
        f"\n{runs} rounds of the four commands (order reversed every other round), "
        f"--profile {PROFILE} --configfile {CONFIG}; load average "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after; {cpu_model()}, "
        f"{os.cpu_count()} cores"
    )
    print(
        f"{'cold dry run (auto)':26}wall {cold[0]:7.2f} s, CPU {cold[1]:7.2f} s (first run, alone)"
    )
    labels = {
        "dry_run_auto": "snakemake -n (auto)",
        "dry_run_fixed": "snakemake -n (fixed)",
        "status": "gpuflow status",
        "plan": "gpuflow plan",
        "status_baseline": "gpuflow status (baseline)",
    }
    for name, label in labels.items():
        if name in times:
            print(f"{label:26}{line(times[name])}")
    ratios = {
        "auto_vs_fixed": ratio(times["dry_run_auto"], times["dry_run_fixed"]),
        "plan_vs_dry_run": ratio(times["plan"], times["dry_run_auto"]),
    }
    if "status_baseline" in times:
        ratios["status_vs_baseline"] = found = ratio(times["status"], times["status_baseline"])
        print(
            f"{'status / baseline':26}median of round ratios {found['median_of_rounds']:.2f}x, "
            f"ratio of medians {found['of_medians']:.2f}x, CPU {found['cpu_of_medians']:.2f}x"
        )
    status = statistics.median(w for w, _ in times["status"])
    for name, label in (
        ("auto_vs_fixed", "dry run auto / fixed"),
        ("plan_vs_dry_run", "plan / dry run (auto)"),
    ):
        found = ratios[name]
        verdict = (
            "met"
            if max(found["median_of_rounds"], found["of_medians"]) <= GOALS[name]
            else "NOT met"
        )
        print(
            f"{label:26}median of round ratios {found['median_of_rounds']:.2f}x, ratio of "
            f"medians {found['of_medians']:.2f}x, rounds "
            f"[{', '.join(f'{r:.2f}' for r in found['per_round'])}] "
            f"(goal <= {GOALS[name]}x: {verdict}); CPU: ratio of medians "
            f"{found['cpu_of_medians']:.2f}x"
        )
    verdict = "met" if status <= GOALS["status_s"] else "NOT met"
    cpu = statistics.median(c for _, c in times["status"])
    print(
        f"{'gpuflow status':26}median {status:.2f} s (goal <= {GOALS['status_s']:.0f} s: "
        f"{verdict}); CPU {cpu:.2f} s"
    )
    return ratios


def cpu_model() -> str:
    """This machine's CPU model, as /proc/cpuinfo names it."""
    try:
        for text in Path("/proc/cpuinfo").read_text().splitlines():
            if text.startswith("model name"):
                return text.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def default_record(benchmark: str = "plan-speed") -> Path:
    """benchmarks/records/<date>-<cpu slug>-<benchmark>.json of this checkout."""
    slug = re.sub(r"[^a-z0-9]+", "-", cpu_model().lower()).strip("-")
    return HERE / "benchmarks" / "records" / f"{datetime.date.today()}-{slug}-{benchmark}.json"


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
