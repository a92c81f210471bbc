"""A `gpuflow` whose named sweep shards fail once, run slow or linger, all else as usual (used by
the live grid test, and by the local lock test to keep a run going).

`install(folder, faults)` writes `folder/gpuflow`, a script that runs this module; with that
folder first on PATH (SLURM jobs inherit the submitter's environment) every rule's `gpuflow
<step>` comes here. `faults` maps a shard's table name (`shard~1.csv`) to
- "fail-once": its first run goes through tests/sweep_faults.py with every seed raising, a real
  failed shard (the seeds are recorded as failed, the step fails); later runs go as usual;
- "slow:<seconds>": it waits that long, then runs as usual;
- "hold-until:<file>": it waits until that file exists (at most HOLD_CAP_S), then runs as usual;
- "seed-hold-until:<file>": it runs, holding its output lock, and each seed waits after its
  work until that file exists (tests/sweep_faults.py), so a test surely meets the step running;
- "seed-floor:<seconds>": every seed of it lasts at least that long (tests/sweep_faults.py), so a
  test can act between two of its seeds;
- "linger-once:<seconds>": its first run writes its outputs as usual, then waits that long before
  it ends (a job ended meanwhile, by its time limit or `scancel`, fails with its outputs written).
The key `ssvae-train` gives SSVAE training "epoch-floor:<seconds>": every epoch lasts at least
that long (it waits out the rest), so a test's time limit cuts the training on a fast machine as
on a slow one (measured: the same 120 epochs took 1-5 s each under load, 0.5 s on a quiet machine).
Or "ballast-from-epoch:<epoch>:<MB>": once that many epochs are trained (and saved), the training
holds <MB> more memory to its end, in every run (a step that outgrows its mem_mb midway); its
numbers do not change.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from tests.floors import floor_method
from tests.slurm.harness import REPO

FAULTS_ENV = "GPUFLOW_TEST_GRID_FAULTS"
MARKS_ENV = "GPUFLOW_TEST_GRID_MARKS"
HOLD_CAP_S = 300


def install(folder: Path, faults: dict[str, str]) -> dict[str, str]:
    """Write folder/gpuflow; return the environment entries that put it to work."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "gpuflow"
    script.write_text(f'#!/bin/sh\nexec {sys.executable} -m tests.slurm.grid_faults "$@"\n')
    script.chmod(0o755)
    marks = folder / "marks"
    marks.mkdir(exist_ok=True)
    path = os.pathsep.join((str(folder), str(Path(sys.executable).parent), os.environ["PATH"]))
    return {
        "PATH": path,
        "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH")))),
        FAULTS_ENV: json.dumps(faults),
        MARKS_ENV: str(marks),
    }


def failing_seeds(args: list[str]) -> str:
    """tests/sweep_faults.py faults that make every seed of the shard raise."""
    start, stop = (int(s) for s in args[args.index("--seeds") + 1].split(":"))
    return ",".join(f"raise:*:{seed}" for seed in range(start, stop))


def ballast_from(epoch: int, megabytes: int) -> None:
    """Make SSVAE training hold `megabytes` more memory (written, so resident) from the epoch
    after `epoch` on."""
    from gpuflow.ssvae.train import StackTrainer

    train_epoch, held = StackTrainer.train_epoch, []

    def heavier(self: StackTrainer) -> Any:
        if self.epoch >= epoch and not held:
            held.append(b"\x01" * (megabytes << 20))
        return train_epoch(self)

    StackTrainer.train_epoch = heavier  # type: ignore[method-assign]


def main(argv: list[str]) -> int:
    """Run `gpuflow` with argv, after the fault this shard is given (if any)."""
    from gpuflow import cli
    from tests import sweep_faults

    faults = json.loads(os.environ.get(FAULTS_ENV, "{}"))
    floor = faults.get("ssvae-train", "")
    if argv[:1] == ["ssvae-train"] and floor.startswith("epoch-floor:"):
        from gpuflow.ssvae.train import StackTrainer

        floor_method(StackTrainer, "train_epoch", float(floor.split(":", 1)[1]))
    if argv[:1] == ["ssvae-train"] and floor.startswith("ballast-from-epoch:"):
        epoch, megabytes = floor.split(":")[1:]
        ballast_from(int(epoch), int(megabytes))
    if argv[:1] == ["sweep-shard"]:
        name = Path(argv[argv.index("--out") + 1]).name
        fault = faults.get(name, "")
        mark = Path(os.environ.get(MARKS_ENV, ".")) / f"{name}.faulted"
        if fault == "fail-once" and not mark.exists():
            mark.touch()
            return sweep_faults.main([failing_seeds(argv), "--", *argv[1:]])
        if fault.startswith("linger-once:") and not mark.exists():
            mark.touch()
            code = cli.main(argv)
            time.sleep(float(fault.split(":", 1)[1]))
            return code
        if fault.startswith("seed-floor:"):
            os.environ[sweep_faults.SEED_FLOOR_ENV] = fault.split(":", 1)[1]
            return sweep_faults.main(["", "--", *argv[1:]])
        if fault.startswith("seed-hold-until:"):
            os.environ[sweep_faults.SEED_RELEASE_ENV] = fault.split(":", 1)[1]
            return sweep_faults.main(["", "--", *argv[1:]])
        if fault.startswith("slow:"):
            time.sleep(float(fault.split(":", 1)[1]))
        if fault.startswith("hold-until:"):
            release, deadline = Path(fault.split(":", 1)[1]), time.monotonic() + HOLD_CAP_S
            while not release.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
