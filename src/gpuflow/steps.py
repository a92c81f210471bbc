"""Steps shared by all families."""

from __future__ import annotations

import argparse

from gpuflow.cli import lazy


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the shared steps to the `gpuflow` parser."""
    doctor = subparsers.add_parser(
        "doctor", help="what this machine offers and what the config will use"
    )
    doctor.add_argument(
        "--configfile",
        nargs="+",
        default=["config/config.yaml"],
        help="config files to explain, later ones merged over earlier (as Snakemake does)",
    )
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.set_defaults(run=lazy("gpuflow.doctor:main"))
