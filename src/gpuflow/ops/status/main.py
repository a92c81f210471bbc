"""`gpuflow status`: read the run once (or every `--watch` seconds) and print it."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuflow.ops.plan import expected_times, plan_jobs, run_folder
from gpuflow.ops.snakemake_adapter import (
    failed_jobs,
    latest_run_log,
    snakemake_started,
    unlock_command,
)
from gpuflow.ops.status.collect import Seen, collect
from gpuflow.ops.status.report import as_dict, render
from gpuflow.slurm.queue import SlurmJob, status_jobs

CLEAR = "\x1b[H\x1b[2J"


@dataclass(frozen=True)
class RunState:
    """Whether a run is active, since when (its Snakemake process), and a lock left stale."""

    active: bool
    started: float | None
    stale_lock: bool


def run_state(locked: bool, snakemake_since: float | None, slurm: dict[str, SlurmJob]) -> RunState:
    """Whether a run is active (SLURM jobs, or a lock and a live Snakemake), or a lock is stale."""
    busy = any(job.active for job in slurm.values())
    alive = locked and snakemake_since is not None
    active = busy or alive
    return RunState(active, snakemake_since if alive else None, locked and not active)


def read_status(args: argparse.Namespace) -> dict[str, Any]:
    """Every job of the targets with its state, from the DAG, Snakemake's records and SLURM."""
    planned = plan_jobs(args, every_job=True)
    directory = Path(args.directory).resolve()
    records = planned.records
    slurm, unreachable = status_jobs(directory)
    run = run_state(records.locked, snakemake_started(directory), slurm)
    seen = Seen(
        directory=directory,
        markers=records.markers,
        slurm=slurm,
        failed=failed_jobs(latest_run_log(directory)),
        run_active=run.active,
        run_started=run.started,
        times=records.times,
        stale_lock=unlock_command(args, records.backend) if run.stale_lock else None,
        backend=records.backend,
        slurm_unreachable=unreachable,
    )
    with run_folder(args):
        jobs = collect(planned, seen, expected_times(args, planned))
    return as_dict(jobs, planned.rule_order, seen)


def show(args: argparse.Namespace) -> None:
    """Print the status once: JSON, or the tables (cleared in place on a terminal with --watch)."""
    started = time.monotonic()
    status = read_status(args)
    if args.json:
        print(json.dumps(status, indent=2), flush=True)
        return
    text = render(status, time.monotonic() - started)
    if args.watch is not None and sys.stdout.isatty():
        text = CLEAR + text
    elif args.watch is not None:
        text += "\n"
    print(text, flush=True)


def main(args: argparse.Namespace) -> None:
    """`gpuflow status [--json] [--watch [SECONDS]]`; Ctrl-C ends --watch after the read in hand."""
    if args.watch is None:
        show(args)
        return
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.is_set():
        show(args)
        stop.wait(args.watch)
