"""`gpuflow calibrate`: the rates a config's jobs need, measured on this machine in a minute.

It plans the config's jobs as `gpuflow plan` does (every job, finished or not), collects the
kind and shape of every term of their work, and measures each on the device the jobs would use
here: a short trial of the family's own code at that shape (`gpuflow.<family>.calibration`),
process start-ups in fresh Python processes, state writes on the run folder's disk. The trials
take turns round by round (three rounds), so a slow spell of a shared machine slows every rate
alike; each rate is their median, with the lowest and highest as its range. The record,
`<date>-<device>-rates.json` in --out, holds one row per rate as gpu-check's rows do; `gpuflow
plan` reads it (`w` rows). A second calibration on the same day and device adds to that record.
On a GPU node the rates of the jobs that ask for no GPU go to a record of the node's CPU, which
`gpuflow plan` reads for those jobs; the host's start-ups and state writes go to both records
where jobs of both need them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuflow.cost.rates import RATES_SUFFIX, rate_row, this_cpu
from gpuflow.cost.rules import planned_work
from gpuflow.cost.work import STARTUP, Term
from gpuflow.job.cores import threads_per_worker
from gpuflow.settings.validate import family_modules

STATE_BYTES = 64 << 20  # a resume state of a mid-sized run
HOST_MEASURED = (STARTUP, "state.write")  # measured once on this host for every device


@dataclass(frozen=True)
class Need:
    """A kind of work at one shape that a planned job needs, with that job's context."""

    term: Term
    rule: str
    config: dict[str, Any]
    wildcards: dict[str, str]
    threads: int
    device: str  # "cpu" or "cuda": where the job's work runs
    folder: Path  # the run folder (state writes land on its disk)


@dataclass
class Trial:
    """One measurement: `run()` does one trial and returns each shape's rate in it; `close()`
    ends what it set up (helper processes), after the last trial. Each trial runs on `threads`
    torch threads (the trials of other measurements set theirs in between)."""

    kind: str
    unit: str
    what: str
    run: Callable[[], dict[str, float]]
    close: Callable[[], None] | None = None
    threads: int | None = None  # torch threads of its trials (default: its job's)


def texts_trial(need: Need, texts: list[str], what: str, process: Callable[[], Any]) -> Trial:
    """A bytes-per-second trial: each run times `process()` over `texts` (their UTF-8 bytes)."""
    size = sum(len(text.encode("utf-8")) for text in texts)

    def run() -> dict[str, float]:
        began = time.perf_counter()
        process()
        return {need.term.shape: size / (time.perf_counter() - began)}

    return Trial(need.term.kind, "bytes/s", what, run)


def measurers() -> dict[str, Callable[[Need], Trial | None]]:
    """kind -> a function setting up its trial (after one warm-up; None where this machine
    cannot measure it), from each family's `calibration` module and the host kinds here."""
    found: dict[str, Callable[[Need], Trial | None]] = {"state.write": state_write}
    for module in family_modules("calibration"):
        found.update(module.MEASURE)
    return found


def needs(args: argparse.Namespace) -> list[Need]:
    """Every (kind, shape) the planned jobs' work needs on each device, once, with the first job
    needing it; its device is a GPU where the job asks for one and this machine has one."""
    import torch

    from gpuflow.ops.plan import plan_jobs

    planned = plan_jobs(args, every_job=True)
    found: dict[tuple[str, str, str], Need] = {}
    for job in planned.jobs:
        work = planned_work(job.rule, planned.config, job.wildcards)
        device = "cuda" if job.gpus and torch.cuda.is_available() else "cpu"
        for term in work.terms if work else ():
            key = (term.kind, term.shape, device)
            if key not in found:
                threads = int(job.resources.get("_cores", 1) or 1)
                found[key] = Need(
                    term, job.rule, planned.config, job.wildcards, threads, device,
                    Path(args.directory),
                )  # fmt: skip
    return list(found.values())


def startup_trial(shapes: list[str]) -> Trial:
    """Start-ups (per second) of fresh processes that import gpuflow's command line and the
    shape's modules, then exit, as a step's process does; one process per shape, as many at
    once as this process may use cores (jobs share a machine so on a local run)."""

    def started(shape: str) -> float:
        imports = "; ".join(f"import {m}" for m in ["gpuflow.cli", *shape.split("+")])
        began = time.perf_counter()
        subprocess.run([sys.executable, "-c", imports], check=True, capture_output=True)
        return 1.0 / (time.perf_counter() - began)

    def run() -> dict[str, float]:
        with ThreadPoolExecutor(threads_per_worker(1)) as pool:
            return dict(zip(shapes, pool.map(started, shapes), strict=True))

    return Trial(STARTUP, "starts/s", f"{len(shapes)} start-ups in fresh processes", run)


def state_write(need: Need) -> Trial:
    """Resume states of STATE_BYTES written as steps write them (atomically, through torch)."""
    import torch

    from gpuflow.job.atomic import save_torch

    state = {"weights": torch.zeros(STATE_BYTES // 4)}
    need.folder.mkdir(parents=True, exist_ok=True)

    def run() -> dict[str, float]:
        with tempfile.TemporaryDirectory(dir=need.folder) as folder:
            began = time.perf_counter()
            save_torch(Path(folder) / "state.pt", state)
            return {"": STATE_BYTES / (time.perf_counter() - began)}

    run()
    return Trial("state.write", "bytes/s", f"{STATE_BYTES >> 20} MB states saved", run)


def measure(found: list[Need], trials: int) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """Rows of every rate of `found` that can be measured here, by the device of the jobs that
    need it ("cpu", "cuda"; a host rate goes to each device whose jobs need it), and lines
    naming those that cannot be (a kind with no measurement here, e.g. a GPU's on a CPU-only
    machine)."""
    import torch

    measuring = measurers()
    users: dict[tuple[str, str], list[str]] = {}  # (kind, shape) -> devices of the jobs needing it
    for need in found:
        devices = users.setdefault((need.term.kind, need.term.shape), [])
        if need.device not in devices:
            devices.append(need.device)
    plan: list[tuple[Trial, str | None]] = []  # with its device; None: a host rate
    skipped = []
    startups = sorted(shape for kind, shape in users if kind == STARTUP)
    if startups:
        plan.append((startup_trial(startups), None))
    for need in found:
        kind = need.term.kind
        host = kind in HOST_MEASURED
        if kind == STARTUP or (host and need.device != users[(kind, need.term.shape)][0]):
            continue
        if kind not in measuring:
            skipped.append(f"{kind} at {need.term.shape}: no calibration measures it")
            continue
        torch.set_num_threads(need.threads)
        trial = measuring[kind](need)
        if trial is None:
            skipped.append(f"{kind} at {need.term.shape}: not measurable on this machine")
        else:
            trial.threads = trial.threads or need.threads
            plan.append((trial, None if host else need.device))
    values: dict[tuple[str, str, str, str, str | None], list[float]] = {}
    try:
        for _ in range(trials):
            for trial, device in plan:
                torch.set_num_threads(trial.threads or 1)
                for shape, value in trial.run().items():
                    key = (trial.kind, shape, trial.unit, trial.what, device)
                    values.setdefault(key, []).append(value)
    finally:
        for trial, _ in plan:
            if trial.close is not None:
                trial.close()
    rows: dict[str, list[dict[str, Any]]] = {}
    for (kind, shape, unit, what, device), rates in values.items():
        for each in [device] if device else users[(kind, shape)]:
            rows.setdefault(each, []).append(rate_row(kind, shape, unit, rates, what))
    return rows, skipped


def device_class(device: str) -> str:
    """The record's device class: this CPU's, or the first GPU's name as gpu-check names it."""
    if device == "cpu":
        return this_cpu()
    import torch

    from gpuflow.ops.gpu_check.records import device_slug

    return device_slug([torch.device("cuda", 0)])


def write_record(
    args: argparse.Namespace, when: datetime.datetime, device: str, rows: list[dict[str, Any]]
) -> Path:
    """Write `rows` into the day's rates record of `device` ("cpu", "cuda") in --out, keeping
    the rows of an earlier calibration that these do not measure again."""
    import torch

    from gpuflow.job.atomic import write_json
    from gpuflow.ops.gpu_check.records import environment

    slug = device_class(device)
    out = Path(args.out) / f"{when.date().isoformat()}-{slug}{RATES_SUFFIX}.json"
    earlier = json.loads(out.read_text()) if out.exists() else {"rows": []}
    measured = {(row["rate"]["kind"], row["rate"]["shape"]) for row in rows}
    kept = [
        r
        for r in earlier.get("rows", [])
        if (r["rate"]["kind"], r["rate"]["shape"]) not in measured
    ]
    env = environment(
        [torch.device(device, 0) if device == "cuda" else torch.device("cpu")], Path.cwd()
    )
    record = {
        "created": when.isoformat(timespec="seconds"),
        **env,
        "device_class": slug,
        "configfiles": list(args.configfile),
        "trials": args.trials,
        "rows": kept + rows,
    }
    write_json(out, record)
    return out


def main(args: argparse.Namespace) -> None:
    """Measure the rates the config's jobs need; write or extend today's rates records."""
    started = time.monotonic()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    rows_by_device, skipped = measure(needs(args), args.trials)
    when = datetime.datetime.now(datetime.UTC)
    took = time.monotonic() - started
    for device, rows in rows_by_device.items():
        out = write_record(args, when, device, rows)
        print(f"calibrate: {len(rows)} rates on {device_class(device)} in {took:.0f} s -> {out}")
        for row in rows:
            rate = row["rate"]
            spread = f"{min(rate['trials']):.3g}-{max(rate['trials']):.3g}"
            shape = f" at {rate['shape']}" if rate["shape"] else ""
            print(f"  {rate['kind']}{shape}: {rate['value']:.3g} {rate['unit']} ({spread})")
    for line in skipped:
        print(f"  not measured: {line}")
