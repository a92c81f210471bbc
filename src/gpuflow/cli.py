"""`gpuflow <step> ...`: every workflow step, callable by hand inside or outside Snakemake.

Steps are registered by `register(subparsers)` functions in the `steps` module of each package
(families, `ops`, ...; `gpuflow.steps` for the shared ones), with `gpuflow.registry.lazy` entry
points.
Registration imports only argparse-level code, so `gpuflow --help` stays fast; each step imports
torch and friends when it runs.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Iterator
from types import ModuleType

import gpuflow
from gpuflow.errors import WRITE_ERRNOS, GpuflowError
from gpuflow.job.gpulock import gpus_for_this_process
from gpuflow.job.outputlock import exclusive_outputs, locks_this_process, step_outputs
from gpuflow.job.stopping import install as install_stop_handlers
from gpuflow.job.telemetry.job import job_telemetry


def step_modules() -> Iterator[ModuleType]:
    """`gpuflow.steps` and every `steps` module of gpuflow's packages, in name order."""
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
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one step; a GpuflowError becomes one clear line on stderr and exit status 2.

    SIGTERM and SIGUSR1 (SLURM's end of time, preemption, or its warning) stop the step
    cleanly (gpuflow.job.stopping). The step holds the lock of each of its outputs
    (gpuflow.job.outputlock) while it runs, so a second run of the same job fails at once. When the
    step needs device locks (whole-node mode, see gpuflow.job.gpulock) they are taken here, before
    the step imports torch. A sampler thread records the job's GPU and CPU use while it runs
    (gpuflow.job.telemetry.job), started after the device locks set CUDA_VISIBLE_DEVICES.
    """
    args = build_parser().parse_args(argv)
    install_stop_handlers()
    outputs = step_outputs(args) if locks_this_process() else []
    try:
        with exclusive_outputs(outputs), gpus_for_this_process(), job_telemetry(outputs) as job:
            code = int(args.run(args) or 0)
            return job.finish(code) if job is not None else code
    except GpuflowError as error:
        print(f"gpuflow {args.step}: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        if error.errno not in WRITE_ERRNOS:
            raise
        where = f"{error.filename}: " if error.filename else ""
        print(
            f"gpuflow {args.step}: error: {where}cannot write ({error.strerror})"
            " (expected a writable output folder with free space)",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
