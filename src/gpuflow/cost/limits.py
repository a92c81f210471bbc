"""`runtime: auto`: a job's time limit from its predicted time."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from gpuflow.cost.expected import from_jobs, recorded_jobs
from gpuflow.cost.models import planned_work
from gpuflow.cost.predict import Prediction, predict
from gpuflow.cost.rates import RateBook, books
from gpuflow.slurm.site import interconnect, stop_warning_minutes
from gpuflow.work import Work

AUTO = "auto"
WARNING_EARLY_MINUTES = 1.0  # SLURM sends --signal's warning up to 60 s before its time


@dataclass(frozen=True)
class Policy:
    """The site's rule for auto limits (site.yaml `auto_runtime`, `stop_warning_minutes`)."""

    margin: float = 1.5
    startup_minutes: float = 2.0
    unknown_minutes: float = 240.0  # a job whose time cannot be predicted
    warning_minutes: float = 0.0
    cap_minutes: float | None = None  # the largest max_runtime of the job's kind of partition

    @classmethod
    def of_site(cls, site: dict[str, Any], cap_minutes: float | None) -> Policy:
        auto = site.get("auto_runtime") or {}
        return cls(
            margin=float(auto.get("margin", cls.margin)),
            startup_minutes=float(auto.get("startup_minutes", cls.startup_minutes)),
            unknown_minutes=float(auto.get("unknown_minutes", cls.unknown_minutes)),
            warning_minutes=stop_warning_minutes(site),
            cap_minutes=cap_minutes,
        )


def warned_minutes(warning_minutes: float) -> float:
    """How long before a job's limit SLURM may send its stop warning; 0 where it sends none."""
    return warning_minutes + WARNING_EARLY_MINUTES if warning_minutes else 0.0


def unwarned(limit_minutes: float, warning_minutes: float) -> bool:
    """Whether a job of this time limit gets the stop warning only as it starts."""
    return bool(warning_minutes) and limit_minutes <= warned_minutes(warning_minutes)


def limit_minutes(prediction: Prediction | None, work: Work | None, policy: Policy) -> int:
    """The time limit (minutes) of a job predicted to take `prediction`."""
    cap = policy.cap_minutes if policy.cap_minutes is not None else math.inf
    if prediction is None or work is None:
        return int(min(cap, policy.unknown_minutes))
    # one saved unit at the prediction's upper end (start-up left out)
    unit = max(0.0, prediction.high - prediction.startup) / max(1, work.units) / 60
    warning = warned_minutes(policy.warning_minutes)
    wanted = policy.startup_minutes + prediction.high * policy.margin / 60 + warning + unit
    return int(min(cap, math.ceil(wanted)))


@cache
def site_plan(
    records: Path, site_file: Path | None, gpu: bool
) -> tuple[Policy, RateBook, list[tuple[str, tuple[str, ...], list[Any]]]]:
    """The site's policy for limits of GPU or CPU jobs, their rate book and the records' jobs."""
    from gpuflow.slurm.fit import retry_limits
    from gpuflow.slurm.site import read_site

    site = read_site(site_file) if site_file and site_file.is_file() else {}
    cap = retry_limits(site_file, gpu).get("runtime") if site else None
    cpu_book, gpu_book = books(records, site.get("gpu_model"), interconnect(site))
    return Policy.of_site(site, cap), gpu_book if gpu else cpu_book, recorded_jobs(records)


def auto_runtime(
    rule: str,
    config: dict[str, Any],
    wildcards: dict[str, str],
    gpu: bool,
    records: str | Path,
    site_file: str | Path | None,
) -> int:
    """The limit (minutes) of one `auto` job of `rule`: its predicted time, by the site's policy."""
    policy, book, jobs = site_plan(Path(records), Path(site_file) if site_file else None, gpu)
    work = planned_work(rule, config, wildcards)
    predicted: Prediction | None = None
    for name, _, rows in jobs if work else ():
        predicted = from_jobs(rule, wildcards, None, work, rows, book, "m", name)
        if predicted is not None:
            break
    if predicted is None and work is not None:
        found = predict(work, book)
        predicted = found if isinstance(found, Prediction) else None
    return limit_minutes(predicted, work, policy)
