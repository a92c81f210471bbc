"""Which rules have a work model: each family's `work` module (WORK: rule -> (config,
wildcards) -> Work or None where its inputs are not here; DONE: rule -> (outputs, inputs) ->
the work a finished job did, for rules whose work is not fixed by their params alone)."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from gpuflow.cost.work import NotHere, Work
from gpuflow.settings.validate import family_modules

Planned = Callable[[dict[str, Any], dict[str, str]], "Work | None"]
Done = Callable[[list[str], list[str]], "Work | None"]


@cache
def registry() -> tuple[dict[str, Planned], dict[str, Done]]:
    """(WORK, DONE) of every family with a `work` module."""
    planned: dict[str, Planned] = {}
    done: dict[str, Done] = {}
    for module in family_modules("work"):
        planned.update(module.WORK)
        done.update(module.DONE)
    return planned, done


def planned_work(rule: str, config: dict[str, Any], wildcards: dict[str, str]) -> Work | None:
    """The work a job of `rule` will do; None where the rule has no work model or its inputs
    (data files, model) are not on this machine (counted_work names them)."""
    try:
        return counted_work(rule, config, wildcards)
    except NotHere:
        return None


def counted_work(rule: str, config: dict[str, Any], wildcards: dict[str, str]) -> Work | None:
    """planned_work, raising NotHere where a family names the inputs that are not here."""
    function = registry()[0].get(rule)
    return function(config, wildcards) if function else None


def has_work_model(rule: str) -> bool:
    return rule in registry()[0]


def params_fix_work(rule: str) -> bool:
    """Whether a job's params fix its work (its rule reads no inputs whose size may change),
    so an earlier job of the same params did the same work."""
    return rule not in registry()[1]


def done_work(rule: str, outputs: list[str], inputs: list[str]) -> Work | None:
    """The work a finished job of `rule` did, read from its outputs and inputs (None where
    they are unreadable); see params_fix_work for rules that need none."""
    return registry()[1][rule](outputs, inputs)
