"""`gpuflow status` with the SLURM controller down vs up: how long a user waits for it.

Usage: python benchmarks/status.py [--rounds 5]

The folder is a finished local run of the status workflow (tests/slurm/status: three jobs, one
failed). SLURM's commands are stand-ins first on PATH:
- down: squeue, sacct and scontrol wait 60 s, then say "Unable to contact slurm controller", as
  SLURM's own do after their retries (status gives squeue 2 s, asks neither of the others);
- up: they answer at once (squeue lists no job of the folder, sacct holds none).
Rounds interleave the two (down, up, down, up, ...); each prints the median and the range of
its wall times, and the ratio down / up (down costs the 2 s squeue is given, no more). Goal:
down within 5 s. Before the fix, with the real slurmctld stopped: 28.5 s (issue 38: 28.8 s).
Measured (2 cores, 5 rounds): down 3.22 s [3.16-3.28], up 1.22 s [1.18-1.23], 2.66x.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SNAKEFILE = REPO / "tests" / "slurm" / "status" / "Snakefile"
DOWN = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"
COMMANDS = {
    "down": {
        name: f"sleep 60; echo '{DOWN}' >&2; exit 1" for name in ("squeue", "sacct", "scontrol")
    },
    "up": {"squeue": "exit 0", "sacct": "exit 0", "scontrol": "exit 0"},
}


def finished_run(folder: Path) -> Path:
    """The status workflow, run to its end (one job fails on purpose)."""
    folder.mkdir()
    (folder / "config.yaml").write_text("steps: 1\nstep_seconds: 0\n", encoding="utf-8")
    command = [str(BIN / "snakemake"), "--snakefile", str(SNAKEFILE), "--directory", str(folder)]
    command += ["--configfile", str(folder / "config.yaml"), "--cores", "2", "--keep-going"]
    subprocess.run(command, capture_output=True, check=False, timeout=300)
    return folder


def stand_ins(folder: Path, bodies: dict[str, str]) -> Path:
    folder.mkdir()
    for name, body in bodies.items():
        (folder / name).write_text(f"#!/bin/sh\nPATH=/usr/bin:/bin\n{body}\n")
        (folder / name).chmod(0o755)
    return folder


def timed_status(workdir: Path, commands: Path) -> float:
    env = {"PATH": f"{commands}:{BIN}:/usr/bin:/bin", "HOME": str(workdir)}
    command = [str(BIN / "gpuflow"), "status", "--snakefile", str(SNAKEFILE)]
    command += ["--directory", str(workdir), "--configfile", str(workdir / "config.yaml")]
    started = time.monotonic()
    subprocess.run(command, capture_output=True, env=env, check=True, timeout=300)
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        workdir = finished_run(root / "run")
        folders = {kind: stand_ins(root / kind, bodies) for kind, bodies in COMMANDS.items()}
        seconds: dict[str, list[float]] = {kind: [] for kind in COMMANDS}
        for _ in range(args.rounds):
            for kind, folder in folders.items():
                seconds[kind].append(timed_status(workdir, folder))
    for kind, values in seconds.items():
        print(
            f"status, controller {kind:4s}: {statistics.median(values):5.2f} s"
            f" [{min(values):.2f}-{max(values):.2f}] over {args.rounds} rounds"
        )
    ratios = sorted(d / u for d, u in zip(seconds["down"], seconds["up"], strict=True))
    print(
        f"down / up: {statistics.median(ratios):.2f}x [{ratios[0]:.2f}-{ratios[-1]:.2f}]"
        f" (goal: down within 5 s: {'met' if statistics.median(seconds['down']) < 5 else 'MISSED'})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
