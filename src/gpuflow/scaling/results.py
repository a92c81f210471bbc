"""The settings a scaling training job's numbers depend on, listed once."""

from __future__ import annotations

from typing import Any

TRAIN_RESULTS_KEYS = ("amp", "tf32", "warmup_epochs", "ddp")


def train_results(scaling: dict[str, Any], name: str) -> dict[str, Any]:
    """The family-level keys and configuration `name` that its training depends on."""
    values = {key: scaling[key] for key in TRAIN_RESULTS_KEYS}
    values["configurations"] = {name: scaling["configurations"][name]}
    return values
