"""`gpuflow probe`: the record of where a job ran, for checking GPU placement and binding."""

from __future__ import annotations

import argparse
import time

import torch

from gpuflow.job.atomic import write_json
from gpuflow.job.devices import run_record, worker_devices


def seeded_value(seed: int, device: torch.device) -> float:
    """Sum of a seeded 64x64 matrix product, computed on `device` in float64."""
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn(64, 64, generator=generator, dtype=torch.float64).to(device)
    return round(float((a @ a.T).sum().cpu()), 6)


def main(args: argparse.Namespace) -> None:
    """Write the run record, with start and end times, after staying `--hold` seconds."""
    started = time.time()
    devices = worker_devices("auto")
    record = run_record(devices)
    value = seeded_value(args.seed, devices[0])
    time.sleep(args.hold)
    write_json(
        args.out,
        {**record, "label": args.label, "value": value, "start": started, "end": time.time()},
    )
