"""`gpuflow` steps of the toy family (tests/test_new_family.py copies this file in)."""

from __future__ import annotations

import argparse

from gpuflow.registry import add_settings_arguments, lazy


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the toy step to the `gpuflow` parser."""
    estimate = subparsers.add_parser(
        "toy-estimate", help="a seeded Monte Carlo estimate of pi, resumable unit by unit"
    )
    add_settings_arguments(estimate, "toy")
    estimate.add_argument("--out", required=True, help="CSV, one row per unit")
    estimate.set_defaults(run=lazy("gpuflow.toy.estimate:main", outputs=("out",)))
