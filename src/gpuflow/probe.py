"""`gpuflow probe`: the record of where a job ran, for checking GPU placement and binding.

Used by the SLURM tests and by hand (`srun --gpus=1 gpuflow probe --out where.json`): the
host, SLURM job, `CUDA_VISIBLE_DEVICES`, the devices gpuflow would use, and when it ran.
"""

from __future__ import annotations

import argparse
import time

from gpuflow.atomic import write_json
from gpuflow.devices import run_record, worker_devices


def main(args: argparse.Namespace) -> None:
    """Write the run record, with start and end times, after staying `--hold` seconds."""
    started = time.time()
    record = run_record(worker_devices("auto"))
    time.sleep(args.hold)
    write_json(args.out, {**record, "label": args.label, "start": started, "end": time.time()})
