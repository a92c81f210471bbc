"""The telemetry section of each family's report: its arguments, and the section itself."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`--telemetry DIR` (the family's results folder) and `--low-utilisation PERCENT`."""
    parser.add_argument(
        "--telemetry",
        default=None,
        help="family folder whose job records the report shows (omit: no such section)",
    )
    parser.add_argument(
        "--low-utilisation",
        type=float,
        default=None,
        help="flag jobs below this utilisation in percent (config telemetry."
        "low_utilisation_percent; default: the schema's)",
    )


def threshold(value: float | None) -> float:
    """The flag threshold: the given one, else the schema's default."""
    if value is not None:
        return value
    from gpuflow.job.telemetry.settings import telemetry_settings

    return float(telemetry_settings()["low_utilisation_percent"])


def section(args: argparse.Namespace) -> str:
    """The markdown section for the report, or '' without `--telemetry` (or when a caller's
    namespace lacks these arguments)."""
    folder = getattr(args, "telemetry", None)
    if folder is None:
        return ""
    from gpuflow.job.telemetry.tables import jobs_section

    return "\n" + jobs_section(folder, threshold(getattr(args, "low_utilisation", None)))
