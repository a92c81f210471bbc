"""`gpuflow status`: read the run once (or every `--watch` seconds) and print it."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gpuflow.ops.plan import plan_jobs
from gpuflow.ops.status.collect import SLURM_QUEUED, SLURM_RUNNING, Seen, collect
from gpuflow.ops.status.report import as_dict, render
from gpuflow.ops.status.snakemake_files import (
    failed_jobs,
    incomplete_markers,
    latest_run_log,
    locked_since,
    snakemake_alive,
)
from gpuflow.slurm.queue import run_jobs

CLEAR = "\x1b[H\x1b[2J"


def read_status(args: argparse.Namespace) -> dict[str, Any]:
    """Every job of the targets with its state, from the DAG, `.snakemake/` and SLURM.

    A run is active while Snakemake's locks are there and a Snakemake process works in the
    directory on this host, or SLURM still runs or queues a job of it (locks alone may be
    left by a killed run).
    """
    planned = plan_jobs(args, every_job=True)
    directory = Path(args.directory)
    slurm = run_jobs(directory)
    busy = any(job.state in SLURM_RUNNING | SLURM_QUEUED for job in slurm.values())
    since = locked_since(directory)
    active = since is not None and (busy or snakemake_alive(directory))
    seen = Seen(
        directory=directory,
        markers=incomplete_markers(directory),
        slurm=slurm,
        failed=failed_jobs(latest_run_log(directory)),
        run_active=active,
        run_started=since if active else None,
    )
    return as_dict(collect(planned, seen), planned.rule_order, seen)


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
