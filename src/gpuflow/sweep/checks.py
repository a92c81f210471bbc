"""Checks across the sweep family's keys, run with the schema's before any job
(gpuflow.settings.validate), and by `sweep-shard` for the rank it is given."""

from __future__ import annotations

from typing import Any

from gpuflow.errors import ConfigError


def check(sweep: dict[str, Any]) -> None:
    """Raise ConfigError where a teacher rank cannot exist in the configured dimensions."""
    for rank in sweep["teacher_ranks"]:
        check_rank(rank, sweep["data"])


def check_rank(rank: int, data: dict[str, Any]) -> None:
    """Raise ConfigError when a teacher of `rank` cannot exist in `data`'s dimensions."""
    most = min(data["input_dim"], data["output_dim"])
    if rank > most:
        raise ConfigError(
            "sweep.teacher_ranks",
            f"rank {rank} exceeds min(sweep.data.input_dim, sweep.data.output_dim)",
            f"ranks <= {most}",
        )
