"""`gpuflow calibrate`: the rates a config's jobs need, measured on this machine in a minute."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gpuflow.cost.models import models, planned_work
from gpuflow.cost.records import add_rows, dated, device_class, environment, rate_field
from gpuflow.job.cores import threads_per_worker
from gpuflow.ops.plan import plan_jobs, run_folder
from gpuflow.work import STARTUP, Need, Trial

STATE_BYTES = 64 << 20  # a resume state of a mid-sized run
HOST_MEASURED = (STARTUP, "state.write")  # measured once on this host for every device
RATES_SUFFIX = "-rates"


def needs(args: argparse.Namespace) -> list[Need]:
    """Every (kind, shape) the planned jobs need on each device, once, with its first job."""
    import torch

    planned = plan_jobs(args, every_job=True)
    found: dict[tuple[str, str, str], Need] = {}
    with run_folder(args):
        for job in planned.jobs:
            work = planned_work(job.rule, planned.config, job.wildcards)
            device = "cuda" if job.gpus and torch.cuda.is_available() else "cpu"
            for term in work.terms if work else ():
                key = (term.kind, term.shape, device)
                if key not in found:
                    threads = int(job.resources.get("_cores", 1) or 1)
                    found[key] = Need(
                        term, job.rule, planned.config, job.wildcards, threads, device,
                        Path(args.directory).resolve(),
                    )  # fmt: skip
    return list(found.values())


def startup_trial(shapes: list[str]) -> tuple[Trial, dict[str, float]]:
    """Start-ups per second of fresh processes importing each shape's modules."""
    per_shape: dict[str, list[float]] = {shape: [] for shape in shapes}

    def started(shape: str) -> float:
        imports = "; ".join(f"import {m}" for m in ["gpuflow.cli", *shape.split("+")])
        began = time.perf_counter()
        subprocess.run([sys.executable, "-c", imports], check=True, capture_output=True)
        return 1.0 / (time.perf_counter() - began)

    def run() -> float:
        with ThreadPoolExecutor(threads_per_worker(1)) as pool:
            rates = dict(zip(shapes, pool.map(started, shapes), strict=True))
        for shape, rate in rates.items():
            per_shape[shape].append(rate)
        return sum(rates.values()) / len(rates)

    what = f"{len(shapes)} start-ups in fresh processes"
    return Trial(STARTUP, "starts/s", what, run), per_shape


def state_write(need: Need) -> Trial:
    """Resume states of STATE_BYTES written as steps write them (atomically, through torch)."""
    import torch

    from gpuflow.job.atomic import save_torch

    state = {"weights": torch.zeros(STATE_BYTES // 4)}
    need.folder.mkdir(parents=True, exist_ok=True)

    def run() -> float:
        with tempfile.TemporaryDirectory(dir=need.folder) as folder:
            began = time.perf_counter()
            save_torch(Path(folder) / "state.pt", state)
            return STATE_BYTES / (time.perf_counter() - began)

    run()
    return Trial("state.write", "bytes/s", f"{STATE_BYTES >> 20} MB states saved", run)


def measure(found: list[Need], trials: int) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """Rows of every rate of `found` measurable here, by device; lines naming the others."""
    import torch

    makers = {"state.write": state_write, **models()[1]}
    users: dict[tuple[str, str], list[str]] = {}  # (kind, shape) -> devices of the jobs needing it
    for need in found:
        devices = users.setdefault((need.term.kind, need.term.shape), [])
        if need.device not in devices:
            devices.append(need.device)
    plan: list[tuple[Trial, str, str | None]] = []  # with its shape and device (None: host)
    skipped = []
    startups = sorted(shape for kind, shape in users if kind == STARTUP)
    per_startup: dict[str, list[float]] = {}
    if startups:
        trial, per_startup = startup_trial(startups)
        plan.append((trial, "", None))
    for need in found:
        kind, shape = need.term.kind, need.term.shape
        host = kind in HOST_MEASURED
        if kind == STARTUP or (host and need.device != users[(kind, shape)][0]):
            continue
        if kind not in makers:
            skipped.append(f"{kind} at {shape}: no calibration measures it")
            continue
        torch.set_num_threads(need.threads)
        made = makers[kind](need)
        if made is None:
            skipped.append(f"{kind} at {shape}: not measurable on this machine")
        else:
            made.threads = made.threads or need.threads
            plan.append((made, shape, None if host else need.device))
    values: dict[tuple[str, str, str, str, str | None], list[float]] = {}
    try:
        for _ in range(trials):
            for trial, shape, device in plan:
                torch.set_num_threads(trial.threads or 1)
                rate = trial.run()
                if trial.kind != STARTUP:
                    key = (trial.kind, shape, trial.unit, trial.what, device)
                    values.setdefault(key, []).append(rate)
    finally:
        for trial, _, _ in plan:
            if trial.close is not None:
                trial.close()
    what = f"{len(startups)} start-ups in fresh processes"
    for shape, rates in per_startup.items():
        values[(STARTUP, shape, "starts/s", what, None)] = rates
    rows: dict[str, list[dict[str, Any]]] = {}
    for (kind, shape, unit, what, device), rates in values.items():
        for each in [device] if device else users[(kind, shape)]:
            rows.setdefault(each, []).append(
                {"path": what, "rate": rate_field(kind, shape, unit, rates)}
            )
    return rows, skipped


def main(args: argparse.Namespace) -> None:
    """Measure the rates the config's jobs need; write or extend today's rates records."""
    import torch

    started = time.monotonic()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    out_folder = Path(args.out).resolve()
    rows_by_device, skipped = measure(needs(args), args.trials)
    took = time.monotonic() - started
    for device, rows in rows_by_device.items():
        on = torch.device(device, 0) if device == "cuda" else torch.device("cpu")
        env = environment([on], Path.cwd())
        out = dated(out_folder, env["device_class"], RATES_SUFFIX)
        more = {"configfiles": list(args.configfile), "trials": args.trials}
        add_rows(out, env, rows, **more)
        print(f"calibrate: {len(rows)} rates on {device_class(on)} in {took:.0f} s -> {out}")
        for row in rows:
            rate = row["rate"]
            spread = f"{min(rate['trials']):.3g}-{max(rate['trials']):.3g}"
            shape = f" at {rate['shape']}" if rate["shape"] else ""
            print(f"  {rate['kind']}{shape}: {rate['value']:.3g} {rate['unit']} ({spread})")
    for line in skipped:
        print(f"  not measured: {line}")
