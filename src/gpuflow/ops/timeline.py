"""`gpuflow timeline`: the run's jobs over time as a figure (lanes as rows, attempts as bars
coloured by rule, marks in a legend) and a table of its bars, from the job records.

Each attempt of a job (`attempts` in its record, gpuflow.job.record_attempts) is one bar per
GPU it held, on the lane of that GPU (SLURM node, else host, and NVML UUID, else the
CUDA_VISIBLE_DEVICES label), or, for a job without GPUs, on a CPU slot of its node: slots are
handed out in start order, each attempt to the first slot free by then, so bars on one lane
never overlap. Bars are coloured by rule and marked where the attempt failed, was stopped by a
signal (time limit, preemption, requeue, Ctrl-C), was requeued in place by SLURM or never
recorded its end.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from gpuflow.errors import ConfigError
from gpuflow.job import save_figure, write_csv
from gpuflow.job.paths import RECORD, family_root, job_of
from gpuflow.job.record import read_record
from gpuflow.job.record_attempts import NO_END, recorded_attempts
from gpuflow.job.telemetry.job import STARTED

FAILED, STOPPED, REQUEUED, UNENDED = "failed", "stopped", "requeued", "no end recorded"
TIMELINE_STEP = "timeline"


@dataclasses.dataclass(frozen=True)
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
    job = attempt.get("slurm_job_id")
    marks = []
    if status.startswith("failed"):
        marks.append(FAILED)
    if status == STOPPED:
        marks.append(STOPPED)
    # requeued: the next attempt is the same SLURM job started again in place (the same job id;
    # a retry by Snakemake is a new SLURM job)
    if later is not None and job is not None and later.get("slurm_job_id") == job:
        marks.append(REQUEUED)
    if status == NO_END or (status == STARTED and later is not None):
        marks.append(UNENDED)
    return tuple(marks)


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


# How each mark looks on a bar (bar keyword arguments) and what the legend calls it.
STYLES: dict[str, tuple[dict[str, Any], str]] = {
    FAILED: ({"edgecolor": "red", "linewidth": 2.0, "hatch": "xx"}, "failed"),
    STOPPED: (
        {"edgecolor": "black", "linewidth": 0.8, "hatch": "///"},
        "stopped by a signal (time limit, preemption, requeue)",
    ),
    UNENDED: (
        {"edgecolor": "black", "linewidth": 1.2, "linestyle": ":", "alpha": 0.6},
        "no end recorded (killed)",
    ),
}
REQUEUED_LABEL = "requeued by SLURM (same job, restart count +1)"


def bar_style(bar: Bar) -> dict[str, Any]:
    """The bar's keyword arguments for its marks (a plain thin edge where it has none)."""
    style: dict[str, Any] = {"edgecolor": "black", "linewidth": 0.3}
    for mark in (UNENDED, STOPPED, FAILED):  # the last one's edge wins
        if mark in bar.marks:
            style.update(STYLES[mark][0])
    return style


# One colour map per family (the part of a rule's name before its first '_', '-' or ':'), a
# shade of it per rule: rules of one family look alike, and 30 rules stay apart.
FAMILY_MAPS = ("Blues", "Oranges", "Greens", "Purples", "Reds", "Greys", "YlOrBr", "PuRd")


def rule_colours(rules: list[str]) -> dict[str, Any]:
    """A colour for each of `rules` (sorted): its family's map, shaded by its place in it."""
    families: dict[str, list[str]] = {}
    for rule in rules:
        families.setdefault(re.split(r"[_:-]", rule, maxsplit=1)[0], []).append(rule)
    colours = {}
    for index, members in enumerate(families.values()):
        shades = plt.get_cmap(FAMILY_MAPS[index % len(FAMILY_MAPS)])
        for place, rule in enumerate(members):
            colours[rule] = shades(0.35 + 0.55 * place / max(len(members) - 1, 1))
    return colours


def figure(bars: list[Bar]) -> plt.Figure:
    """The timeline of `bars`: one row per lane, time since the first start along x."""
    lanes = lane_order(bars)
    colour = rule_colours(sorted({bar.rule for bar in bars}))
    legend_rows = len(colour) + len({mark for bar in bars for mark in bar.marks})
    height = max(1.6 + 0.34 * len(lanes), 0.6 + 0.19 * legend_rows)
    fig, ax = plt.subplots(figsize=(11, height))
    if not bars:
        ax.text(0.5, 0.5, "no job records", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return fig
    row = {lane: index for index, lane in enumerate(lanes)}
    t0 = min(bar.start for bar in bars)
    unit, seconds = time_unit(max(bar.end for bar in bars) - t0)
    for bar in bars:
        left, width = (bar.start - t0) / seconds, (bar.end - bar.start) / seconds
        ax.barh(
            row[bar.lane], width, left=left, height=0.7, color=colour[bar.rule], **bar_style(bar)
        )
        if REQUEUED in bar.marks:
            ax.plot(left + width, row[bar.lane] - 0.42, marker="v", color="black", markersize=7)
    ax.set_yticks(range(len(lanes)), lanes, fontsize=8)
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    ax.set_xlim(left=0)
    since = time.strftime("%Y-%m-%d %H:%M", time.localtime(t0))
    ax.set_xlabel(f"time since the first start, {since} ({unit})")
    ax.grid(axis="x", color="#ddd", linewidth=0.6)
    ax.set_axisbelow(True)
    jobs = len({bar.job for bar in bars})
    attempts = len({(bar.job, bar.attempt) for bar in bars})
    ax.set_title(
        f"{jobs} jobs, {attempts} attempts on {len(lanes)} lanes (GPU or CPU slot)", fontsize=10
    )
    ax.legend(
        handles=legend(bars, colour),
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=8,
        frameon=False,
    )
    return fig


def legend(bars: list[Bar], colour: dict[str, Any]) -> list[Any]:
    """A patch per rule, then one per mark any bar has."""
    handles: list[Any] = [
        Patch(facecolor=c, edgecolor="black", linewidth=0.3, label=r) for r, c in colour.items()
    ]
    present = {mark for bar in bars for mark in bar.marks}
    for mark in (FAILED, STOPPED, UNENDED):
        if mark in present:
            style, label = STYLES[mark]
            handles.append(Patch(facecolor="white", label=label, **style))
    if REQUEUED in present:
        handles.append(
            Line2D([], [], marker="v", color="black", linestyle="", label=REQUEUED_LABEL)
        )
    return handles


def main(args: argparse.Namespace) -> None:
    """Draw the timeline of the job records under `--results` into `--out`; its bars, one row
    each, go to `--out-table`."""
    try:
        patterns = json.loads(args.rules) if args.rules else {}
    except ValueError as error:
        raise ConfigError("--rules", f"not JSON ({error})", "{rule: [output regex, ...]}") from None
    if not isinstance(patterns, dict):
        raise ConfigError("--rules", "not a JSON object", "{rule: [output regex, ...]}")
    records = read_records(args.results)
    bars = timeline_bars(records, rule_namer(patterns), time.time())
    # the numbers behind the figure, a row per bar, its marks joined by ';'
    rows = [{**dataclasses.asdict(bar), "marks": ";".join(bar.marks)} for bar in bars]
    columns = [field.name for field in dataclasses.fields(Bar)]
    write_csv(args.out_table, pd.DataFrame(rows, columns=columns))
    fig = figure(bars)
    save_figure(args.out, fig)  # atomically, in the format its suffix names
    plt.close(fig)
    print(f"{len(bars)} bars ({len(records)} jobs) on {len(lane_order(bars))} lanes -> {args.out}")
