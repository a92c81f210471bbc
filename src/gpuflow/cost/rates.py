"""Rates measured on a device class: the rate book every prediction reads."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuflow.cost.records import Record, read_records, slug, this_cpu
from gpuflow.work import STARTUP, Work

HOST_KINDS = (STARTUP, "state.write", "lm.load")
ALLREDUCE = "allreduce.bytes"
INTERCONNECT = "the site file's interconnect"  # the source of a datasheet all-reduce rate


@dataclass(frozen=True)
class Rate:
    """How fast `kind` of work goes at `shape` on `device`: `value` units/s (`low`-`high`)."""

    kind: str
    shape: str
    value: float
    low: float
    high: float
    unit: str
    source: str
    device: str
    measured: bool = True


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


def job_row(row: dict[str, Any]) -> dict[str, Any] | None:
    """A record row's finished job (rule, wildcards, seconds, params, work), or None."""
    job = row.get("job")
    if not isinstance(job, dict) or not isinstance(job.get("rule"), str):
        return None
    seconds = job.get("seconds")
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
        return None
    try:
        work = Work.from_dict(job["work"]) if "work" in job else None
    except (KeyError, TypeError, ValueError):
        work = None
    return {**job, "work": work, "wildcards": dict(job.get("wildcards") or {})}


def job_rates(records: list[Record], measured: dict[str, list[Rate]]) -> dict[str, list[Rate]]:
    """Whole-job rates of the records' job rows, by device class."""
    found: dict[str, list[Rate]] = {}
    for record in records:
        book = RateBook(record.device_class, measured.get(record.device_class, []))
        for row in record.rows:
            job = job_row(row)
            work = job["work"] if job else None
            if job is None or work is None:
                continue
            main = [t for t in work.terms if t.kind not in HOST_KINDS]
            if len({(t.kind, t.shape) for t in main}) != 1:
                continue
            host = [t for t in work.terms if t.kind in HOST_KINDS]
            seconds = job["seconds"] - sum(
                t.amount / t.parallel / rate.value
                for t in host
                if (rate := book.find(t.kind, t.shape)[0]) is not None
            )
            value = sum(t.amount / t.parallel for t in main) / seconds if seconds > 0 else 0.0
            if value > 0:
                rate = Rate(
                    main[0].kind, main[0].shape, value, value, value, "", record.name,
                    record.device_class,
                )  # fmt: skip
                found.setdefault(record.device_class, []).append(rate)
    return found


@dataclass(frozen=True, order=True)
class StandIn:
    """A rate of `kind` measured at shape `measured`, taken for shape `wanted`."""

    kind: str
    measured: str
    wanted: str


@dataclass
class RateBook:
    """The rates of one device class, newest first, and the site's interconnect bandwidths."""

    device: str | None
    rates: list[Rate]
    interconnect: dict[str, float] | None = None

    def find(self, kind: str, shape: str) -> tuple[Rate | None, StandIn | None]:
        """The newest rate of `kind` at `shape`, else a stand-in shape's (with its StandIn)."""
        same_kind = [rate for rate in self.rates if rate.kind == kind]
        exact = [rate for rate in same_kind if rate.shape == shape]
        if exact:
            return exact[0], None
        if kind == ALLREDUCE:
            return interconnect_rate(shape, self.interconnect or {}, self.device or "?"), None
        if same_kind and kind != STARTUP:
            rate = max(same_kind, key=lambda rate: likeness(rate.shape, shape))
            return rate, StandIn(kind, rate.shape, shape)
        return None, None


def interconnect_rate(shape: str, interconnect: dict[str, float], device: str) -> Rate | None:
    """All-reduce bytes/s of a '<backend> x<world> n<nodes>' shape at site bandwidth, or None."""
    try:
        backend, world, nodes = shape.split()
        n, spread = int(world[1:]), int(nodes[1:]) > 1
    except ValueError:
        return None
    bandwidth = interconnect.get("between_nodes" if spread else "within_node")
    if backend != "nccl" or not bandwidth or n < 2:
        return None
    value = float(bandwidth) * 1e9 * n / (2 * (n - 1))
    return Rate(ALLREDUCE, shape, value, value, value, "bytes/s", INTERCONNECT, device, False)


def likeness(measured: str, wanted: str) -> int:
    """How many words of two shapes agree, place by place (the nearest shape gives a stand-in)."""
    return sum(a == b for a, b in zip(measured.split(), wanted.split(), strict=False))


def gpu_classes(rates: dict[str, list[Rate]]) -> list[str]:
    """Device classes with rates that are GPUs (not CPUs), newest record first."""
    newest = {device: max(rate.source[:10] for rate in found) for device, found in rates.items()}
    gpus = [device for device in newest if not device.startswith("cpu")]
    return sorted(gpus, key=lambda device: newest[device], reverse=True)


def books(
    folder: str | Path,
    gpu: str | None = None,
    interconnect: dict[str, float] | None = None,
    whole_jobs: bool = True,
) -> tuple[RateBook, RateBook]:
    """(CPU book, GPU book): this machine's CPU class and the GPU class named by `gpu`."""
    records = read_records(folder)
    rates: dict[str, list[Rate]] = {}
    for record in records:
        for row in record.rows:
            rate = row_rate(row, record.name, record.device_class)
            if rate is not None:
                rates.setdefault(record.device_class, []).append(rate)
    if whole_jobs:
        for device, found in job_rates(records, rates).items():
            rates[device] = [*found, *rates.get(device, [])]
    cpu = this_cpu()
    classes = [device for device in gpu_classes(rates) if slug(gpu or "") in device]
    chosen = classes[0] if classes else None
    gpu_book = RateBook(chosen, rates.get(chosen, []) if chosen else [], interconnect)
    return RateBook(cpu, rates.get(cpu, [])), gpu_book
