"""The telemetry settings (config `telemetry`), defaulted from the schema: the one place."""

from __future__ import annotations

from typing import Any

from gpuflow.settings.blocks import defaulted

INTERVAL_ENV = "GPUFLOW_TELEMETRY_INTERVAL_S"


def telemetry_settings(values: dict[str, Any] | None = None) -> dict[str, Any]:
    """`values` (a config's `telemetry` part, possibly absent), validated and defaulted from the
    schema as every family's settings are."""
    return defaulted(dict(values or {}), "telemetry")


def interval_environment(settings: dict[str, Any]) -> dict[str, str]:
    """The environment that gives every job's sampler the configured interval."""
    return {INTERVAL_ENV: str(settings["interval_s"])}
