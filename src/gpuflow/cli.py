"""`gpuflow <step> ...`: every workflow step, callable by hand inside or outside Snakemake."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import signal
import sys
from collections.abc import Iterator
from types import ModuleType

import gpuflow
from gpuflow.errors import WRITE_ERRNOS, GpuflowError
from gpuflow.job import Job
from gpuflow.job.outputlock import step_outputs
from gpuflow.job.stopping import Stopped, held
from gpuflow.job.telemetry.settings import take_job_settings
from gpuflow.registry import add_job_settings_arguments


def step_modules() -> Iterator[ModuleType]:
    """The `steps` module of every gpuflow package, in name order."""
    packages = pkgutil.walk_packages(gpuflow.__path__, prefix="gpuflow.")
    for name in sorted(info.name for info in packages if info.name.endswith(".steps")):
        yield importlib.import_module(name)


def build_parser() -> argparse.ArgumentParser:
    """The `gpuflow` argument parser with every registered step."""
    parser = argparse.ArgumentParser(prog="gpuflow", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=gpuflow.__version__)
    subparsers = parser.add_subparsers(dest="step", required=True, metavar="<step>")
    for module in step_modules():
        module.register(subparsers)
    for step_parser in subparsers.choices.values():
        add_job_settings_arguments(step_parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one step; an error or stop request is one line and status 2, Ctrl-C 130."""
    args = build_parser().parse_args(argv)
    return run_step(args, f"gpuflow {args.step}")


def run_step(args: argparse.Namespace, name: str) -> int:
    """Run the step `args.run` inside its job `args.step`, as `main` describes."""
    try:
        with Job(args.step, step_outputs(args), take_job_settings(args)) as job:
            with held():  # a stop request waits for the step's imports (torch): see `held`
                step = args.run.load()
            return job.finish(int(step(args) or 0))
    except (GpuflowError, Stopped) as error:
        print(f"{name}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{name}: error: interrupted by Ctrl-C", file=sys.stderr)
        return 128 + signal.SIGINT
    except OSError as error:
        if error.errno not in WRITE_ERRNOS:
            raise
        where = f"{error.filename}: " if error.filename else ""
        print(
            f"{name}: error: {where}cannot write ({error.strerror})"
            " (expected a writable output folder with free space)",
            file=sys.stderr,
        )
        return 2
