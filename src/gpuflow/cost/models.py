"""Every family's work models (its `work` module's WORK, TRIALS, DONE) and a job's work."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from gpuflow.settings.validate import family_modules
from gpuflow.work import Need, NotHere, Trial, Work

Planned = Callable[[dict[str, Any], dict[str, str]], Work]
TrialMaker = Callable[[Need], "Trial | None"]
Done = Callable[[list[str], list[str]], "Work | None"]


@cache
def models() -> tuple[dict[str, Planned], dict[str, TrialMaker], dict[str, Done]]:
    """(WORK, TRIALS, DONE) of every family with a `work` module."""
    planned: dict[str, Planned] = {}
    trials: dict[str, TrialMaker] = {}
    done: dict[str, Done] = {}
    for module in family_modules("work"):
        planned.update(module.WORK)
        trials.update(module.TRIALS)
        done.update(getattr(module, "DONE", {}))
    return planned, trials, done


def has_work_model(rule: str) -> bool:
    return rule in models()[0]


def counted_work(rule: str, config: dict[str, Any], wildcards: dict[str, str]) -> Work | None:
    """The work a job of `rule` will do (None: no work model); NotHere where inputs are missing."""
    function = models()[0].get(rule)
    return function(config, wildcards) if function else None


def planned_work(rule: str, config: dict[str, Any], wildcards: dict[str, str]) -> Work | None:
    """counted_work, None where its inputs are not here."""
    try:
        return counted_work(rule, config, wildcards)
    except NotHere:
        return None


def done_work(rule: str, config: dict[str, Any], job: Any) -> Work | None:
    """The work a finished job did: from its files (DONE), else its planned work under `config`."""
    read = models()[2].get(rule)
    return read(job.output, job.input) if read else planned_work(rule, config, job.wildcards)
