"""`gpuflow toy-estimate`: a seeded Monte Carlo estimate of pi, one unit of random points at a
time, in the job's resumable loop (tests/test_new_family.py copies this file in).

Unit u draws its points from a generator of its own, seeded by (seed, u), so a resumed run
draws what an uninterrupted one draws; the resume state holds the rows of the units done.
"""

from __future__ import annotations

import argparse
import random
from typing import Any

from gpuflow.job import current, write_text
from gpuflow.settings.blocks import family_settings, results_of


def unit_row(seed: int, unit: int, points: int) -> dict[str, int]:
    """The points of unit `unit` inside the quarter circle."""
    draw = random.Random(f"{seed}:{unit}").random
    inside = sum(1 for _ in range(points) if draw() ** 2 + draw() ** 2 <= 1.0)
    return {"unit": unit, "inside": inside, "points": points}


class Estimate:
    """The rows of the units done: what the job saves after each unit and resumes from."""

    def __init__(self) -> None:
        self.rows: list[dict[str, int]] = []

    def state(self) -> dict[str, Any]:
        return {"rows": self.rows}

    def load(self, saved: dict[str, Any]) -> int:
        self.rows = saved["rows"]
        return len(self.rows)

    def value(self) -> float:
        """4 x the share of all points so far inside the quarter circle."""
        return 4 * sum(r["inside"] for r in self.rows) / sum(r["points"] for r in self.rows)

    def table(self) -> str:
        lines, inside, points = ["unit,inside,points,estimate"], 0, 0
        for row in self.rows:
            inside, points = inside + row["inside"], points + row["points"]
            lines.append(f"{row['unit']},{row['inside']},{row['points']},{4 * inside / points!r}")
        return "\n".join(lines) + "\n"


def main(args: argparse.Namespace) -> int:
    toy = family_settings("toy", args.settings, args.runtime)
    job = current([args.out])
    state = job.state(settings=results_of("toy", toy))
    estimate = Estimate()
    units = toy["units"]
    for unit in job.loop(state, units, "units", load=estimate.load, save=estimate.state):
        estimate.rows.append(unit_row(toy["seed"], unit, toy["points"]))
        job.check_finite("toy", unit, {"estimate": estimate.value()})
        if unit % toy["log_every"] == 0:
            print(f"unit {unit}/{units}: pi ~ {estimate.value():.5f}", flush=True)
    write_text(args.out, estimate.table())
    job.release()
    return 0
