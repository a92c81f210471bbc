"""GPU-lock row: more one-GPU jobs than devices, started at once, as in whole-node mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.gpu_check.rows import CheckRow
from gpuflow.job.gpulock import DEVICES_ENV, GPUS_ENV, LOCK_DIR_ENV, LOCKED_ENV
from gpuflow.ops.probe import seeded_value

HOLD_SECONDS = 1.5
SEED = 7


def lock_row(folder: Path, pool: list[str], on_gpu: bool) -> CheckRow:
    """len(pool) + 1 jobs asking one GPU each: distinct devices at any time, one seen per job."""
    import torch

    env = {k: v for k, v in os.environ.items() if k not in (LOCKED_ENV, "CUDA_VISIBLE_DEVICES")}
    env.update({LOCK_DIR_ENV: str(folder / "locks"), GPUS_ENV: "1", DEVICES_ENV: ",".join(pool)})
    outs = [folder / f"job{i}.json" for i in range(len(pool) + 1)]
    probe = [sys.executable, "-m", "gpuflow", "probe", "--hold", str(HOLD_SECONDS)]
    start = time.perf_counter()
    jobs = [
        subprocess.Popen([*probe, "--seed", str(SEED), "--out", str(out)], env=env) for out in outs
    ]
    codes = [job.wait() for job in jobs]
    seconds = time.perf_counter() - start
    problems = [f"job {i} exited {code}" for i, code in enumerate(codes) if code]
    records = [json.loads(out.read_text()) for out in outs if out.is_file()]
    expected = seeded_value(SEED, torch.device("cpu"))
    for i, record in enumerate(records):
        visible = record["cuda_visible_devices"] or ""
        if visible not in pool:
            problems.append(f"job {i} saw CUDA_VISIBLE_DEVICES={visible!r}")
        if on_gpu and len(record["devices"]) != 1:
            problems.append(f"job {i} used {record['devices']}")
        if abs(record["value"] - expected) > 1e-6 * abs(expected):
            problems.append(f"job {i} computed {record['value']} instead of {expected}")
    for i, a in enumerate(records):
        for b in records[i + 1 :]:
            same = a["cuda_visible_devices"] == b["cuda_visible_devices"]
            if same and a["start"] < b["end"] and b["start"] < a["end"]:
                problems.append(f"two jobs held device {a['cuda_visible_devices']} at once")
    return CheckRow(
        path=f"GPU locks: {len(outs)} one-GPU jobs on {len(pool)} device(s)",
        ok=not problems and len(records) == len(outs),
        tolerance="each job sees one device of the pool, never one in use, and computes the "
        "float64 reference value",
        deviation="; ".join(problems) or "none",
        seconds=seconds,
        devices=sorted({d for r in records for d in r["devices"]}),
        extra={"held": [r["cuda_visible_devices"] for r in records]},
    )
