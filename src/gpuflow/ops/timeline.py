"""`gpuflow timeline`: the run's jobs over time as a figure (lanes as rows, attempts as bars
coloured by rule, marks in a legend) and a table of its bars, from the job records."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import time
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
from gpuflow.ops.timeline_bars import (
    FAILED,
    REQUEUED,
    STOPPED,
    UNENDED,
    Bar,
    lane_order,
    read_records,
    rule_namer,
    time_unit,
    timeline_bars,
)

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


def draw(bars: list[Bar], out: str | Path) -> None:
    """Write the timeline of `bars` to `out` (atomically; the format its suffix names)."""
    fig = figure(bars)
    save_figure(out, fig)
    plt.close(fig)


def bar_rows(bars: list[Bar]) -> list[dict[str, Any]]:
    """The bars as table rows (the numbers behind the figure): marks joined by ';'."""
    return [{**dataclasses.asdict(bar), "marks": ";".join(bar.marks)} for bar in bars]


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
    columns = [field.name for field in dataclasses.fields(Bar)]
    write_csv(args.out_table, pd.DataFrame(bar_rows(bars), columns=columns))
    draw(bars, args.out)
    print(f"{len(bars)} bars ({len(records)} jobs) on {len(lane_order(bars))} lanes -> {args.out}")
