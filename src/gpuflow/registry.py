"""The step registry's building blocks, shared by `gpuflow.cli` and every family's `steps`."""

from __future__ import annotations

import argparse
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass

StepMain = Callable[[argparse.Namespace], int | None]


@dataclass(frozen=True)
class LazyStep:
    """A step entry point 'module:function', imported when the step runs, and its outputs."""

    target: str
    outputs: tuple[str, ...] = ()

    def load(self) -> StepMain:
        """The step's function, its module imported (stop requests held meanwhile)."""
        return pkgutil.resolve_name(self.target)


def lazy(target: str, outputs: tuple[str, ...] = ()) -> LazyStep:
    """The entry point of a step, 'module:function', and the arguments holding its outputs."""
    return LazyStep(target, outputs)


def add_settings_arguments(parser: argparse.ArgumentParser, family: str) -> None:
    """`--settings` (results keys) and `--runtime` (runtime keys) of config[family], as JSON."""
    for option, kind, example in (
        ("settings", "results-affecting", "nested as in the config"),
        ("runtime", "runtime-only", "device, workers, batch sizes"),
    ):
        text = f"JSON: {kind} keys of config['{family}'] ({example})"
        parser.add_argument(f"--{option}", default="{}", help=text)


def add_job_settings_arguments(parser: argparse.ArgumentParser) -> None:
    """`--settings` and `--runtime` (the job's own settings) on a step without family settings."""
    for option, kind in (("settings", "results"), ("runtime", "runtime")):
        if parser.get_default(option) is None:
            parser.add_argument(
                f"--{option}",
                default="{}",
                help=f"JSON: {kind} keys of the job's own settings, as"
                ' {"telemetry": {...}} (config telemetry)',
            )
