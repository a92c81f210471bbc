"""A job's work: what it computes, counted before it runs, in the units rates are measured in.

Each term is an amount of one kind of work (FLOP of a model's step, bytes of text, seeds of a
cell, a process start) with the shape it is done at; a rate of the same kind and shape, measured
on a device, turns it into seconds (gpuflow.cost.predict). A job's work is the sum of its terms:
start-up, the work of each saved unit (epoch, chunk, seed) times the units, evaluation, state
saves. Nothing here imports torch: the Snakefile asks for it while it is parsed (`runtime: auto`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gpuflow.errors import GpuflowError

# A process start: Python, gpuflow's command line and the imports its shape names.
STARTUP = "startup"


class NotHere(GpuflowError):
    """A job's work cannot be counted here: the inputs it is counted from (`missing`: files, a
    model) are not on this machine."""

    def __init__(self, missing: list[str]):
        super().__init__(f"not here: {', '.join(missing)}")


@dataclass(frozen=True)
class Term:
    """`amount` of work of `kind` done at `shape` (what a rate of the same kind must match),
    with `what` in words, e.g. '75 epochs x 499 steps x 10 runs x 200 examples'; `parallel`
    devices or processes share it evenly."""

    kind: str
    amount: float
    shape: str = ""
    what: str = ""
    parallel: int = 1  # devices or processes that share the amount evenly


@dataclass(frozen=True)
class Work:
    """The terms of one job, the saved units it is cut into (a stop loses at most one), and
    notes on what was estimated rather than counted."""

    terms: tuple[Term, ...]
    units: int = 1
    unit: str = "job"
    notes: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        return {
            "terms": [asdict(term) for term in self.terms],
            "units": self.units,
            "unit": self.unit,
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> Work:
        """The work `as_dict` wrote (a timings record's entry)."""
        terms = tuple(Term(**term) for term in value["terms"])
        return cls(terms, int(value["units"]), str(value["unit"]), tuple(value.get("notes", ())))


def startup(*modules: str, processes: int = 1, at_once: bool = False) -> Term:
    """The start of `processes` processes (one after another, or `at_once` on cores of their
    own) that import `modules`: a step's module, and the packages it imports only once it runs
    (e.g. transformers when it loads a model); what they import is found when calibrated."""
    shape = "+".join(modules)
    what = f"{processes} processes importing {shape}" if processes > 1 else f"import {shape}"
    return Term(STARTUP, float(processes), shape, what, processes if at_once else 1)


def count(value: float) -> str:
    """A count in words: 1,234 / 12.3 k / 4.56 M / 7.89 G ... as numbers are read in a plan."""
    for size, suffix in ((1e15, " P"), (1e12, " T"), (1e9, " G"), (1e6, " M"), (1e3, " k")):
        if abs(value) >= size:
            return f"{value / size:.3g}{suffix}"
    return f"{value:.3g}"
