"""The sections of `gpuflow gpu-check`, in the order they run (the biggest GPU user first)."""

from __future__ import annotations

from collections.abc import Sequence

SECTIONS = ("perplexity", "oom", "ssvae", "scaling", "sweep", "locks", "telemetry")


def whole_run(sections: Sequence[str]) -> bool:
    """Whether `sections` are all of them (a whole run, not a run of some sections)."""
    return set(sections) == set(SECTIONS)
