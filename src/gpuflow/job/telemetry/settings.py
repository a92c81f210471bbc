"""The job's own settings (config `telemetry`), defaulted from the schema: the one place."""

from __future__ import annotations

import argparse
import json
from typing import Any

from gpuflow.settings.blocks import family_settings

BLOCK = "telemetry"


def take_job_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The job's settings from the `telemetry` part of `args.settings` and `args.runtime`,
    which is removed from them: the step reads only its family's keys."""
    parts = {"settings": "{}", "runtime": "{}"}
    for option in parts:
        try:
            values = json.loads(getattr(args, option, None) or "null")
        except json.JSONDecodeError:
            continue
        if isinstance(values, dict) and BLOCK in values:
            parts[option] = json.dumps(values.pop(BLOCK))
            setattr(args, option, json.dumps(values, sort_keys=True))
    return family_settings(BLOCK, parts["settings"], parts["runtime"])
