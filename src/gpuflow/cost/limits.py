"""`runtime: auto`: a job's time limit from its predicted time.

limit = the job's own start-up allowance (Snakemake's in-job start) + the prediction's upper
end x margin + SLURM's stop warning and the minute by which SLURM may send it early + one saved
unit past it (a step warned in its last unit still saves it before the limit), in whole
minutes; never above the largest max_runtime of the site's partitions of the job's kind. The
early minute is sbatch's own word ("the signal may be sent up to 60 seconds earlier than
specified"): without it, a short limit's warning can come before the job's step has started,
reaches no process, and the step runs into SIGTERM at the limit unwarned. The
margin and allowance are the site file's (`auto_runtime`). Where no prediction exists (no
work model, inputs or rate), the job asks for the site's `unknown_minutes`, and `gpuflow plan`
says which calibration would give a prediction. A too-tight limit costs a
retry, not the work: the step saves at the warning and its retry (twice the limit) resumes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuflow.cost.predict import Prediction, predict
from gpuflow.cost.rates import books
from gpuflow.cost.rules import planned_work
from gpuflow.cost.work import Work
from gpuflow.slurm.site import stop_warning_minutes

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
    """How long before a job's limit SLURM may send its stop warning: the site's warning and the
    minute it may come early (WARNING_EARLY_MINUTES); 0 where the site sends none."""
    return warning_minutes + WARNING_EARLY_MINUTES if warning_minutes else 0.0


def unwarned(limit_minutes: float, warning_minutes: float) -> bool:
    """Whether a job of this time limit gets the stop warning only as it starts: its limit is no
    longer than `warned_minutes`."""
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


def auto_runtime(
    rule: str,
    config: dict[str, Any],
    wildcards: dict[str, str],
    gpu: bool,
    records: str | Path,
    site_file: str | Path | None,
) -> int:
    """The limit (minutes) of one job of `rule` whose runtime is `auto`: its work at the rates
    of `records` for the site's GPU model (or this CPU), under the site's policy."""
    from gpuflow.slurm.fit import retry_limits
    from gpuflow.slurm.site import read_site

    site = read_site(site_file) if site_file and Path(site_file).is_file() else {}
    cap = retry_limits(site_file, gpu).get("runtime") if site else None
    policy = Policy.of_site(site, cap)
    work = planned_work(rule, config, wildcards)
    cpu_book, gpu_book = books(records, site.get("gpu_model"))
    predicted = predict(work, gpu_book if gpu else cpu_book) if work else None
    return limit_minutes(predicted if isinstance(predicted, Prediction) else None, work, policy)
