"""What a job costs, as steps: calibrate (rates of this machine) and ledger (spent vs planned)."""

from __future__ import annotations

import argparse

from gpuflow.ops.steps import add_records_out_argument, add_run_arguments, add_timings_argument
from gpuflow.registry import lazy


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the cost steps to the `gpuflow` parser."""
    calibrate = subparsers.add_parser(
        "calibrate",
        help="measure the rates the config's jobs need on this machine (about a minute on a"
        " laptop), for gpuflow plan",
    )
    add_run_arguments(calibrate)
    add_records_out_argument(calibrate)
    calibrate.add_argument(
        "--trials", type=int, default=3, help="interleaved trials per rate (default %(default)s)"
    )
    calibrate.set_defaults(run=lazy("gpuflow.cost.calibrate:main", outputs=("out",)))

    ledger = subparsers.add_parser(
        "ledger",
        help="per rule, what a run spent (job records, sacct) against what was planned,"
        " during and after the run",
    )
    add_run_arguments(ledger)
    add_timings_argument(ledger)
    ledger.add_argument("--json", action="store_true", help="print the ledger as JSON")
    ledger.set_defaults(run=lazy("gpuflow.cost.ledger:main"))
