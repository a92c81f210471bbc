"""The job lifecycle's own steps: clean-states, with-gpus."""

from __future__ import annotations

import argparse

from gpuflow.registry import lazy


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the job lifecycle's steps to the `gpuflow` parser."""
    clean_states = subparsers.add_parser(
        "clean-states",
        help="remove the resume states the workflow kept for jobs whose outputs now exist",
    )
    clean_states.add_argument("--directory", default=".", help="working directory of the workflow")
    clean_states.set_defaults(run=lazy("gpuflow.job.finished_states:clean_main"))

    with_gpus = subparsers.add_parser(
        "with-gpus",
        help="run a command (e.g. torchrun) holding the GPUs GPUFLOW_GPUS asks for",
        description="Whole-node mode: `GPUFLOW_GPUS={resources.gpu} gpuflow with-gpus -- CMD`.",
    )
    with_gpus.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS ...")
    with_gpus.set_defaults(run=lazy("gpuflow.job.gpulock:with_gpus_main"))
