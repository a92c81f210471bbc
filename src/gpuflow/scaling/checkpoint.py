"""The resume state of a training run: one file beside its outputs, replaced after every epoch.

The state holds weights, optimiser, schedule, loss scaler and the per-epoch measurements so far,
plus a fingerprint of the run's settings: a state left by different settings is ignored.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from gpuflow.job.atomic import save_torch
from gpuflow.resume import read_state


def fingerprint(settings: dict[str, Any]) -> str:
    """A short hash of everything that makes two runs the same run."""
    text = json.dumps(settings, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def file_digest(*paths: str | Path) -> str:
    """A hash of the files' content (the run's data: a changed split or setting changes it)."""
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        digest.update(b"\0")
    return digest.hexdigest()


def state_path(out: str | Path) -> Path:
    """The resume file that belongs to output `out` (hidden, in the same folder)."""
    out = Path(out)
    return out.with_name(f".{out.stem}.resume.pt")


def save(path: Path, state: dict[str, Any]) -> None:
    """Write the state atomically: a kill during the write leaves the previous state intact."""
    save_torch(path, state)


def load(path: Path, expected: str, device: torch.device) -> dict[str, Any] | None:
    """The saved state when it exists and was written by the same settings, else None."""
    state = read_state(path, device)
    if state is None:
        return None
    if state.get("fingerprint") != expected:
        print(f"ignoring {path}: written by different settings")
        return None
    return state
