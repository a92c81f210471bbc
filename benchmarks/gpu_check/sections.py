"""The sections of gpu-check, in the order they run (the biggest GPU user first)."""

from __future__ import annotations

SECTIONS = ("perplexity", "oom", "ssvae", "scaling", "sweep", "locks", "telemetry")
