"""A job's time from its work and rates (`w`, `s`), or from benchmarks scaled by its work."""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpuflow.cost.rates import HOST_KINDS, RateBook, StandIn
from gpuflow.work import STARTUP, Work


@dataclass(frozen=True)
class Prediction:
    """Seconds expected (between `low` and `high`), from `source`, with what they rest on."""

    seconds: float
    low: float
    high: float
    source: str
    basis: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    startup: float = 0.0
    stand_ins: tuple[StandIn, ...] = ()


@dataclass(frozen=True)
class Missing:
    """No prediction: the rates the work needs that no record has."""

    kinds: tuple[str, ...]


def predict(work: Work, book: RateBook) -> Prediction | Missing:
    """Seconds of `work` at the rates of `book`; Missing names what no record measured."""
    seconds = low = high = started = 0.0
    basis: dict[str, None] = {}
    notes: dict[str, None] = dict.fromkeys(work.notes)
    stand_ins: dict[StandIn, None] = {}
    missing: list[str] = []
    unmeasured: dict[str, None] = {}
    datasheet = False
    for term in work.terms:
        rate, stand_in = book.find(term.kind, term.shape)
        if rate is None and term.kind in HOST_KINDS:
            unmeasured[term.kind] = None
            continue
        if rate is None:
            missing.append(f"{term.kind} at {term.shape}" if term.shape else term.kind)
            continue
        share = term.amount / term.parallel
        seconds += share / rate.value
        started += share / rate.value if term.kind == STARTUP else 0.0
        low += share / rate.high
        high += share / rate.low
        basis[rate.source] = None
        datasheet = datasheet or not rate.measured
        if stand_in:
            stand_ins[stand_in] = None
    if missing:
        return Missing(tuple(dict.fromkeys(missing)))
    if unmeasured:
        notes[f"{', '.join(unmeasured)} not measured on {book.device}: left out"] = None
    source = "s" if datasheet else "w"
    return Prediction(
        seconds, low, high, source, tuple(basis), tuple(notes), started, tuple(stand_ins)
    )


def main_amount(work: Work) -> float:
    """The amount of the work's first term that is not a start-up (its main computation)."""
    return next((term.amount for term in work.terms if term.kind != STARTUP), 0.0)


def from_benchmarks(
    samples: list[tuple[float, Work | None]], work: Work, book: RateBook, source: str, name: str
) -> Prediction | None:
    """A job's time from earlier benchmarks of its rule and params, scaled by its work."""
    mine = predict(work, book)
    scaled = []
    for seconds, done in samples:
        if done is None:
            scaled.append(seconds)
            continue
        theirs = predict(done, book)
        if isinstance(mine, Prediction) and isinstance(theirs, Prediction) and theirs.seconds:
            scaled.append(seconds * mine.seconds / theirs.seconds)
        elif main_amount(done) > 0 and {t.kind for t in done.terms} == {t.kind for t in work.terms}:
            scaled.append(seconds * main_amount(work) / main_amount(done))
    if not scaled:
        return None
    mean = sum(scaled) / len(scaled)
    if not isinstance(mine, Prediction):
        return Prediction(mean, min(scaled), max(scaled), source, (name,))
    # the job's own work's notes, start-up share and stand-in rates hold for its benchmarks too
    return replace(
        mine, seconds=mean, low=min(scaled), high=max(scaled), source=source, basis=(name,)
    )
