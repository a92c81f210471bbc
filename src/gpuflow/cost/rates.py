"""Rates measured on a device class, read from the records in benchmarks/records/.

A rate says how fast one kind of work goes at one shape on one device: FLOP/s of a model's step,
bytes/s of a scorer, seeds/s of a sweep cell, process starts per second. Every record row that
carries a `rate` (gpu-check's rows, `gpuflow calibrate`'s) gives one; its value is the median of
the row's interleaved trials and its range their lowest and highest. The newest record of a
device class wins for each kind and shape.

Host rates (process start-up, state writes, model loading) are the host's: where a device
class's records lack them (gpu-check measures none), a prediction leaves those terms out and
says so; `gpuflow calibrate` on that machine measures them.
"""

from __future__ import annotations

import json
import os
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuflow.cost.work import STARTUP

HOST_KINDS = (STARTUP, "state.write", "lm.load")
RECORDS_ENV = "GPUFLOW_RECORDS"  # where the records are, where not benchmarks/records


def rate_records(checkout: str | Path = ".") -> Path:
    """The records that rates and timings come from: $GPUFLOW_RECORDS, else the checkout's
    benchmarks/records (the workflow's folder for the Snakefile, the working one for steps)."""
    return Path(os.environ.get(RECORDS_ENV) or Path(checkout) / "benchmarks" / "records")


DATED = re.compile(r"^(\d{4}-\d{2}-\d{2})-(.+)\.json$")
RATES_SUFFIX = "-rates"  # `gpuflow calibrate`'s records: <date>-<device>-rates.json


@dataclass(frozen=True)
class Rate:
    """How fast `kind` of work goes at `shape` on `device`: `value` (the median of its trials)
    units per second, between `low` and `high`; measured by `source` (a record's file name)."""

    kind: str
    shape: str
    value: float
    low: float
    high: float
    unit: str
    source: str
    device: str


def rate_field(kind: str, shape: str, unit: str, trials: list[float]) -> dict[str, Any]:
    """The `rate` of a record row: `kind` at `shape`, the median of `trials` (per second)."""
    value = statistics.median(trials)
    return {"kind": kind, "shape": shape, "unit": unit, "value": value, "trials": trials}


def rate_row(kind: str, shape: str, unit: str, trials: list[float], what: str) -> dict[str, Any]:
    """A record row carrying one rate measured in `trials` (units per second, one per trial)."""
    return {"path": what, "rate": rate_field(kind, shape, unit, trials)}


def row_rate(row: dict[str, Any], source: str, device: str) -> Rate | None:
    """The rate a record row carries, or None (a row without one, or a malformed one)."""
    rate = row.get("rate")
    if not isinstance(rate, dict) or row.get("ok") is False:
        return None
    try:
        value = float(rate["value"])
        trials = [float(t) for t in rate.get("trials") or [value]]
        kind, shape, unit = str(rate["kind"]), str(rate["shape"]), str(rate["unit"])
    except (KeyError, TypeError, ValueError):
        return None
    if not (value > 0 and all(t > 0 for t in trials)):
        return None
    return Rate(kind, shape, value, min(trials), max(trials), unit, source, device)


def device_of(name: str) -> str | None:
    """The device class a record's file name names: '2026-11-26-nvidia-h100-80gb-hbm3-perplexity
    .json' -> 'nvidia-h100-80gb-hbm3' (a gpu-check record of some sections, or rates)."""
    match = DATED.match(name)
    if match is None:
        return None
    rest = match[2]
    for suffix in (RATES_SUFFIX, "-timings", "-kingma", "-pilot"):
        if rest.endswith(suffix):
            return rest[: -len(suffix)] if suffix == RATES_SUFFIX else None
    from gpuflow.ops.gpu_check.sections import SECTIONS

    parts = rest.split("-")
    while parts and parts[-1] in SECTIONS:
        parts.pop()
    return "-".join(parts) or None


def read_rates(folder: str | Path) -> dict[str, list[Rate]]:
    """Every rate of the records in `folder` by device class, newest record first (by the
    time it was created: a day's records of some gpu-check sections follow its whole run)."""
    records = []
    for path in Path(folder).glob("*.json"):
        device = device_of(path.name)
        try:
            record = json.loads(path.read_text(encoding="utf-8")) if device else None
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and isinstance(record.get("rows"), list):
            records.append(
                (str(record.get("created") or path.name[:10]), path.name, device, record)
            )
    found: dict[str, list[Rate]] = {}
    for _, name, device, record in sorted(records, reverse=True):
        for row in record["rows"]:
            rate = row_rate(row, name, device) if isinstance(row, dict) else None
            if rate is not None:
                found.setdefault(device, []).append(rate)
    return found


@dataclass(frozen=True, order=True)
class StandIn:
    """A rate of `kind` measured at shape `measured`, taken for shape `wanted`."""

    kind: str
    measured: str
    wanted: str


@dataclass
class RateBook:
    """The rates of one device class, newest first."""

    device: str | None
    rates: list[Rate]

    def find(self, kind: str, shape: str) -> tuple[Rate | None, StandIn | None]:
        """The newest rate of `kind` at `shape`, else at another shape (and the StandIn that
        says which); None where none is known."""
        same_kind = [rate for rate in self.rates if rate.kind == kind]
        exact = [rate for rate in same_kind if rate.shape == shape]
        if exact:
            return exact[0], None
        if same_kind and kind != STARTUP:
            rate = max(same_kind, key=lambda rate: likeness(rate.shape, shape))
            return rate, StandIn(kind, rate.shape, shape)
        return None, None


def likeness(measured: str, wanted: str) -> int:
    """How many words of two shapes agree, place by place (the nearest measured shape is the
    one a rate of another shape is taken from; ties go to the newest)."""
    return sum(a == b for a, b in zip(measured.split(), wanted.split(), strict=False))


def slug(name: str) -> str:
    """A device name as records name it: 'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def this_cpu() -> str:
    """This machine's CPU as a device class: 'cpu-<model>-<n>c' (cores this process may use)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    models = (line.split(":", 1)[1] for line in lines if line.startswith("model name"))
    name = slug(next(models, "cpu"))
    cores = len(os.sched_getaffinity(0))
    return f"{name}-{cores}c" if name.startswith("cpu") else f"cpu-{name}-{cores}c"


def job_rates(folder: str | Path, measured: dict[str, list[Rate]]) -> dict[str, list[Rate]]:
    """Rates of whole jobs the committed timings records hold (gpuflow record-timings), by
    device class: for a job whose work is one kind of computation at one shape (its host work
    aside), that amount over the job's seconds less what its host work took at the `measured`
    rates of its device (where known): what jobs of that kind ran at, overheads included."""
    from gpuflow.cost.work import Work
    from gpuflow.ops.timings import records

    found: dict[str, list[Rate]] = {}
    for name, record in records(Path(folder)):
        device = slug(record["devices"][0].split("(", 1)[-1].rstrip(")"))
        book = RateBook(device, measured.get(device, []))
        for entry in record["benchmarks"].values():
            if "work" not in entry:
                continue
            work = Work.from_dict(entry["work"])
            main = [t for t in work.terms if t.kind not in HOST_KINDS]
            if len({(t.kind, t.shape) for t in main}) != 1:
                continue
            seconds = entry["seconds"] - sum(
                t.amount / t.parallel / rate.value
                for t in work.terms
                if t.kind in HOST_KINDS and (rate := book.find(t.kind, t.shape)[0]) is not None
            )
            value = sum(t.amount / t.parallel for t in main) / seconds if seconds > 0 else 0.0
            if value > 0:
                rate = Rate(main[0].kind, main[0].shape, value, value, value, "", name, device)
                found.setdefault(device, []).append(rate)
    return found


def gpu_classes(rates: dict[str, list[Rate]]) -> list[str]:
    """Device classes with rates that are GPUs (not CPUs), newest record first."""
    newest = {device: max(rate.source[:10] for rate in found) for device, found in rates.items()}
    gpus = [device for device in newest if not device.startswith("cpu")]
    return sorted(gpus, key=lambda device: newest[device], reverse=True)


def books(
    folder: str | Path, gpu: str | None = None, whole_jobs: bool = True
) -> tuple[RateBook, RateBook]:
    """(CPU book, GPU book): this machine's CPU class, and the GPU class whose name holds `gpu`
    (e.g. 'h100', the site's gpu_model), else the newest GPU class with records. With
    `whole_jobs`, the rates of jobs the timings records hold come first (job_rates)."""
    rates = read_rates(folder)
    if whole_jobs:
        for device, found in job_rates(folder, rates).items():
            rates[device] = [*found, *rates.get(device, [])]
    cpu = this_cpu()
    cpu_book = RateBook(cpu, rates.get(cpu, []))
    classes = [device for device in gpu_classes(rates) if (gpu or "").lower() in device]
    chosen = classes[0] if classes else None
    return cpu_book, RateBook(chosen, rates.get(chosen, []) if chosen else [])
