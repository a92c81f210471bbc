"""The telemetry settings (config `telemetry`), defaulted from the schema: the one place."""

from __future__ import annotations

from typing import Any

from gpuflow.settings.validate import SCHEMA_DIR, load_schema

INTERVAL_ENV = "GPUFLOW_TELEMETRY_INTERVAL_S"


def telemetry_settings(values: dict[str, Any] | None = None) -> dict[str, Any]:
    """`values` (a config's `telemetry` part, possibly absent) over the schema's defaults."""
    schema = load_schema(SCHEMA_DIR / "telemetry.schema.yaml")
    defaults = {name: key["default"] for name, key in schema["properties"].items()}
    return {**defaults, **(values or {})}


def interval_environment(settings: dict[str, Any]) -> dict[str, str]:
    """The environment that gives every job's sampler the configured interval."""
    return {INTERVAL_ENV: str(settings["interval_s"])}
