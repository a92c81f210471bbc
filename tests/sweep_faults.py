"""Fault injection for the sweep tests, outside the package: real faults in real workers.

`python -m tests.sweep_faults FAULTS -- <gpuflow sweep-shard arguments>` runs the real shard
step with its seed function wrapped: FAULTS="kill:0:5,raise:*:7" makes worker process 0 SIGKILL
itself when it starts seed 5, and any worker raise at seed 7. With SWEEP_TEST_SEED_FLOOR_S set,
every seed lasts at least that many seconds (it waits out the rest after its real work), so a
test can act between two seeds that take milliseconds; with SWEEP_TEST_SEED_RELEASE set to a
file, every seed waits after its work until that file exists (at most RELEASE_CAP_S), so the step
surely still runs, holding its output lock, until the test lets it go. Workers are spawned, so
the fault list, the floor and the release travel in the environment and each worker finds its id
in its process name.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import time
from typing import Any

FAULTS_ENV = "SWEEP_TEST_FAULTS"
SEED_FLOOR_ENV = "SWEEP_TEST_SEED_FLOOR_S"
SEED_RELEASE_ENV = "SWEEP_TEST_SEED_RELEASE"
RELEASE_CAP_S = 300


def parse_faults(text: str) -> list[tuple[str, str, int]]:
    """(action, worker id or '*', seed) from 'kill:0:5,raise:*:7'."""
    faults = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        action, worker, seed = item.split(":")
        if action not in ("kill", "raise"):
            raise ValueError(f"unknown fault action {action!r} (expected kill or raise)")
        faults.append((action, worker, int(seed)))
    return faults


def run_seed_with_faults(settings: dict[str, Any], seed: int, device: Any) -> dict[str, Any]:
    """The real seed function, after the faults this worker is told to meet at `seed`."""
    from gpuflow.sweep.experiment import run_seed

    worker = mp.current_process().name.rsplit("-", 1)[-1]  # "sweep-worker-<id>"
    for action, who, at in parse_faults(os.environ.get(FAULTS_ENV, "")):
        if at == seed and who in ("*", worker):
            if action == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"injected fault at seed {seed}")
    begin = time.monotonic()
    row = run_seed(settings, seed, device)
    floor = float(os.environ.get(SEED_FLOOR_ENV) or 0)
    time.sleep(max(0.0, floor - (time.monotonic() - begin)))
    release = os.environ.get(SEED_RELEASE_ENV)
    while release and not os.path.exists(release) and time.monotonic() < begin + RELEASE_CAP_S:
        time.sleep(0.05)
    return row


def main(argv: list[str]) -> int:
    """Run `gpuflow sweep-shard` with the seed function wrapped by the faults in argv[0]."""
    from gpuflow import cli
    from gpuflow.sweep import shard

    faults, args = argv[0], argv[argv.index("--") + 1 :]
    parse_faults(faults)
    os.environ[FAULTS_ENV] = faults
    shard.TARGET = f"{__name__}:run_seed_with_faults"
    return cli.main(["sweep-shard", *args])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
