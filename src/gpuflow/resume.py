"""Resume state files: read one back, or say why it cannot be used so the run starts over.

A state file is only a shortcut: when it is truncated, corrupted or not a state at all (a disk
filled up, a copy went wrong, someone replaced it), the run reports it and starts from scratch
instead of failing. Files are read with `weights_only=True`, so a file holding code is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def read_state(path: Path, map_location: Any) -> dict[str, Any] | None:
    """The state saved at `path`, or None (with a line in the log) when it cannot be used."""
    if not path.is_file():
        return None
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:  # any reader error means the same: start over
        reason = (str(error).strip().splitlines() or [""])[0][:200]
        print(
            f"ignoring {path}: unreadable resume state ({type(error).__name__}: {reason});"
            " starting over",
            flush=True,
        )
        return None
    if not isinstance(state, dict):
        print(f"ignoring {path}: not a resume state; starting over", flush=True)
        return None
    return state
