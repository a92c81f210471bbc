"""The telemetry section of each family's report."""

from __future__ import annotations

from pathlib import Path

from gpuflow.job.paths import family_root


def section(out: str | Path) -> str:
    """The markdown section on the job records of the family that report `out` belongs to,
    flagging jobs below the job's `telemetry.low_utilisation_percent`."""
    from gpuflow.job import current
    from gpuflow.job.telemetry.tables import jobs_section

    threshold = float(current().settings["low_utilisation_percent"])
    return "\n" + jobs_section(family_root(out), threshold)
