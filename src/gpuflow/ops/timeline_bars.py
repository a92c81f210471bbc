"""The bars of the run's timeline (`gpuflow timeline`): job attempts on GPU and CPU-slot lanes.

Each attempt of a job (`attempts` in its record, gpuflow.job.record_attempts) is one bar per
GPU it held, on the lane of that GPU (SLURM node, else host, and NVML UUID, else the
CUDA_VISIBLE_DEVICES label), or, for a job without GPUs, on a CPU slot of its node: slots are
handed out in start order, each attempt to the first slot free by then, so bars on one lane
never overlap. Bars are coloured by rule and marked where the attempt failed, was stopped by a
signal (time limit, preemption, requeue, Ctrl-C), was requeued in place by SLURM or never
recorded its end.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuflow.job.paths import RECORD, family_root, job_of
from gpuflow.job.record import read_record
from gpuflow.job.record_attempts import NO_END, recorded_attempts
from gpuflow.job.telemetry.job import STARTED

FAILED, STOPPED, REQUEUED, UNENDED = "failed", "stopped", "requeued", "no end recorded"
TIMELINE_STEP = "timeline"


@dataclass(frozen=True)
class Bar:
    """One attempt of one job on one lane, from `start` to `end` (epoch seconds)."""

    job: str  # the job's first output, as its record names it
    rule: str
    attempt: int  # 1-based, in the record's order
    lane: str
    start: float
    end: float
    status: str
    marks: tuple[str, ...]


def read_records(results: str | Path) -> list[dict[str, Any]]:
    """Every readable job record under `results` (its families' `jobs/` folders), in path order,
    but those of the timeline's own step."""
    records = []
    for path in sorted(Path(results).rglob(f"*.{RECORD}")):
        record = read_record(path) if job_of(path, RECORD) is not None else None
        outputs = record.get("outputs") if record is not None else None
        if outputs and isinstance(outputs, list) and record.get("step") != TIMELINE_STEP:
            records.append(record)
    return records


def rule_namer(patterns: dict[str, list[str]]) -> Callable[[dict[str, Any]], str]:
    """A function naming the rule of a record: the first rule one of whose output patterns
    (regular expressions, as the workflow passes them) matches one of the record's outputs;
    else the record's step, after its family where the step does not name it."""
    compiled = [
        (rule, re.compile(pattern))
        for rule, rule_patterns in patterns.items()
        for pattern in rule_patterns
    ]

    def name(record: dict[str, Any]) -> str:
        outputs = [str(output) for output in record["outputs"]]
        for rule, pattern in compiled:
            if any(pattern.fullmatch(output) for output in outputs):
                return rule
        step = str(record.get("step", "?"))
        family = family_root(outputs[0]).name
        return step if step.startswith(family) else f"{family}: {step}"

    return name


def attempt_marks(attempts: list[dict[str, Any]], index: int) -> tuple[str, ...]:
    """What to mark on attempt `index` of a job's `attempts`."""
    attempt = attempts[index]
    status = str(attempt.get("status"))
    later = attempts[index + 1] if index + 1 < len(attempts) else None
    marks = []
    if status.startswith("failed"):
        marks.append(FAILED)
    if status == STOPPED:
        marks.append(STOPPED)
    if later is not None and requeued_into(attempt, later):
        marks.append(REQUEUED)
    if status == NO_END or (status == STARTED and later is not None):
        marks.append(UNENDED)
    return tuple(marks)


def requeued_into(attempt: dict[str, Any], later: dict[str, Any]) -> bool:
    """Whether `later` is `attempt`'s SLURM job started again in place (a requeue: the same job
    id; a retry by Snakemake is a new SLURM job)."""
    job = attempt.get("slurm_job_id")
    return job is not None and later.get("slurm_job_id") == job


def attempt_end(attempts: list[dict[str, Any]], index: int, now: float) -> float:
    """When attempt `index` ended: its record's end; for one that never recorded it, when the
    next attempt started, or now where it is the last (still running)."""
    attempt = attempts[index]
    if isinstance(attempt.get("ended"), int | float):
        return float(attempt["ended"])
    if index + 1 < len(attempts) and isinstance(attempts[index + 1].get("started"), int | float):
        return float(attempts[index + 1]["started"])
    return max(now, float(attempt["started"]))


def gpu_lane(host: str, gpu: dict[str, Any]) -> str:
    """The lane of one GPU of a host: by NVML UUID where the record has it, else its label."""
    uuid = gpu.get("uuid")
    return f"{host} {uuid}" if uuid else f"{host} GPU {gpu.get('device')}"


def timeline_bars(
    records: list[dict[str, Any]], rule_of: Callable[[dict[str, Any]], str], now: float
) -> list[Bar]:
    """One bar per attempt of each record per GPU it held (one on a CPU slot for an attempt
    without GPUs), ordered by start."""
    bars, cpu_attempts = [], []
    for record in records:
        job, rule = str(record["outputs"][0]), rule_of(record)
        attempts = [
            a for a in recorded_attempts(record) if isinstance(a.get("started"), int | float)
        ]
        for index, attempt in enumerate(attempts):
            host = str(attempt.get("node") or attempt.get("host") or "?")  # SLURM's node name
            fields = {
                "job": job,
                "rule": rule,
                "attempt": index + 1,
                "start": float(attempt["started"]),
                "end": attempt_end(attempts, index, now),
                "status": str(attempt.get("status")),
                "marks": attempt_marks(attempts, index),
            }
            gpus = [g for g in attempt.get("gpus") or [] if isinstance(g, dict)]
            if gpus:
                bars += [Bar(lane=gpu_lane(host, gpu), **fields) for gpu in gpus]
            else:
                cpu_attempts.append((host, fields))
    bars += cpu_slot_bars(cpu_attempts)
    return sorted(bars, key=lambda bar: (bar.start, bar.lane))


def cpu_slot_bars(attempts: list[tuple[str, dict[str, Any]]]) -> list[Bar]:
    """Bars of attempts without GPUs, each on the first CPU slot of its host free at its start."""
    slots: dict[str, list[float]] = {}  # per host, when each slot's last bar ends
    bars = []
    for host, fields in sorted(attempts, key=lambda item: (item[1]["start"], item[1]["end"])):
        ends = slots.setdefault(host, [])
        free = next((i for i, end in enumerate(ends) if end <= fields["start"]), len(ends))
        if free == len(ends):
            ends.append(fields["end"])
        else:
            ends[free] = fields["end"]
        bars.append(Bar(lane=f"{host} CPU slot {free + 1}", **fields))
    return bars


def lane_order(bars: list[Bar]) -> list[str]:
    """Lanes top to bottom: by host, its GPUs before its CPU slots, in number order."""

    def key(lane: str) -> tuple[Any, ...]:
        host, _, rest = lane.partition(" ")
        cpu = rest.startswith("CPU slot ")
        number = re.search(r"(\d+)$", rest)
        return host, cpu, int(number.group(1)) if number else -1, rest

    return sorted({bar.lane for bar in bars}, key=key)


def time_unit(span_s: float) -> tuple[str, float]:
    """The x axis's unit for a timeline `span_s` long: seconds, minutes or hours."""
    if span_s <= 600:
        return "s", 1.0
    return ("min", 60.0) if span_s <= 3 * 3600 else ("h", 3600.0)
