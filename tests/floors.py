"""Slow a method down to a floor, for the fault wrappers (tests/chunk_faults.py,
tests/slurm/grid_faults.py): a test can then act between two calls that would otherwise take
milliseconds on a quiet machine and a varying time on a busy one. Results do not change."""

from __future__ import annotations

import time
from typing import Any


def floor_method(owner: type, name: str, seconds: float) -> None:
    """Make every call of `owner.name` last at least `seconds` (it waits out the rest after the
    real call)."""
    method = getattr(owner, name)

    def at_least(self: Any, *args: Any, **kwargs: Any) -> Any:
        begin = time.monotonic()
        result = method(self, *args, **kwargs)
        time.sleep(max(0.0, seconds - (time.monotonic() - begin)))
        return result

    setattr(owner, name, at_least)
