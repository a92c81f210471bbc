"""How fast this machine runs the fixed costs the test suite pays per process, against a record.

Usage: .venv/bin/python benchmarks/machine_speed.py [--rounds 5] [--against RECORD]
       [--save-record [PATH]]

`make test` is CPU-bound on 2 cores, and most of its CPU is fixed cost per process (docs/
development.md): a suite's minutes on one machine say little about another. Each yardstick is a
fresh process doing one such thing; its CPU seconds (user + system, the child's own) are taken
in rounds that interleave the yardsticks, in rotating order, so a machine's drift falls on all.
It prints each one's median and range; with `--against`, the ratio of each median to the
record's and their geometric mean: how many times the CPU this machine needs for the same work.

Measured on the project's 2-core machine (2026-11-29, idle, 5 rounds; the record is
benchmarks/records/2026-11-29-intel-r-xeon-r-processor-machine-speed.json): `import torch`
2.87 CPU-s [2.13-3.04], a Snakemake start 2.23 [1.71-2.41], transformers' GPT-2 8.38
[7.25-8.75]. docs/development.md gave 1.2, 1.05 and 2.8 for 2026-11-28, from the suite's own
per-process log (not this script; torch was 2.13.0 then too, transformers and Snakemake were not
yet locked): 2.4x, 2.1x and 3.0x. A later run compares with `--against` that record.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import resource
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(HERE))
from benchmarks.plan_speed import commit_of, cpu_model, default_record  # noqa: E402 (this checkout's)

YARDSTICKS = {
    "python start": [sys.executable, "-c", "pass"],
    "python loop (5M adds)": [sys.executable, "-c", "s = 0\nfor i in range(5_000_000): s += i"],
    "import torch": [sys.executable, "-c", "import torch"],
    "first optimizer step": [
        sys.executable,
        "-c",
        "import torch\nm = torch.nn.Linear(64, 64)\ntorch.optim.AdamW(m.parameters()).step()",
    ],
    "import GPT-2 (transformers)": [
        sys.executable,
        "-c",
        "import transformers.models.gpt2.modeling_gpt2",
    ],
    "snakemake start": [str(BIN / "snakemake"), "--version"],
}


def cpu_seconds(command: list[str]) -> float:
    """User + system CPU seconds of one run of `command` (a child process, waited for)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def measure(rounds: int) -> dict[str, list[float]]:
    """Each yardstick's CPU seconds, one per round; each round starts one yardstick later."""
    names = list(YARDSTICKS)
    times: dict[str, list[float]] = {name: [] for name in names}
    for number in range(rounds):
        for name in names[number % len(names) :] + names[: number % len(names)]:
            times[name].append(cpu_seconds(YARDSTICKS[name]))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--against", type=Path, help="an earlier record of this script")
    parser.add_argument("--save-record", nargs="?", const=True, help="write the figures as JSON")
    args = parser.parse_args()
    times = measure(args.rounds)
    medians = {name: statistics.median(values) for name, values in times.items()}
    earlier = json.loads(args.against.read_text())["median_cpu_s"] if args.against else {}
    ratios = {name: medians[name] / earlier[name] for name in medians if earlier.get(name)}
    print(f"{cpu_model()}, {args.rounds} rounds; CPU seconds of each yardstick's process:")
    for name, values in times.items():
        spread = f"[{min(values):.2f}-{max(values):.2f}]"
        ratio = f"  {ratios[name]:.2f}x the record" if name in ratios else ""
        print(f"  {name:<28} median {medians[name]:6.2f} {spread}{ratio}")
    if ratios:
        mean = math.exp(statistics.mean(math.log(r) for r in ratios.values()))
        print(f"geometric mean: this machine needs {mean:.2f}x the record's CPU for the same work")
    if args.save_record:
        path = default_record("machine-speed")
        path = path if args.save_record is True else Path(args.save_record)
        record = {
            "benchmark": "machine_speed",
            "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "cpu": cpu_model(),
            "commit": commit_of(HERE),
            "rounds": args.rounds,
            "cpu_s": times,
            "median_cpu_s": medians,
        }
        path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        print(f"record: {path}")


if __name__ == "__main__":
    main()
