"""Resume states: one format and one path scheme for every family and loop over units."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import gpuflow
from gpuflow.job.paths import STATE, job_file


def make_fingerprint(
    inputs: Iterable[str | Path] = (), settings: Any = None, identity: Any = None
) -> str:
    """What a state must match to be resumed: inputs, results settings, identity, version."""
    digest = hashlib.sha256()  # of the inputs' content, in order
    for path in inputs:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        digest.update(b"\0")
    text = json.dumps(
        {
            "inputs": digest.hexdigest(),
            "settings": settings,
            "identity": identity,
            "gpuflow": gpuflow.__version__,
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def read_state(path: Path, map_location: Any) -> dict[str, Any] | None:
    """The torch file saved at `path`, or None (with a line in the log) when it cannot be used."""
    import torch

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


class State:
    """The resume state of one job: `load()` it when it matches, `save(...)` after each unit."""

    def __init__(self, first_output: str | Path, fingerprint: str):
        self.first_output = Path(first_output)
        self.path = job_file(first_output, STATE)
        self.fingerprint = fingerprint
        self.started = time.monotonic()
        self.earlier_s = 0.0  # what earlier attempts spent on the loaded state

    def load(self, map_location: Any = "cpu") -> dict[str, Any] | None:
        """The saved data when the state exists and matches, else None (and one line why)."""
        state = read_state(self.path, map_location)
        if state is None:
            self._mention_legacy()
            return None
        if "data" not in state or not isinstance(state["data"], dict):
            print(f"ignoring {self.path}: not a resume state of this gpuflow; starting over")
            return None
        if state.get("fingerprint") != self.fingerprint:
            print(
                f"ignoring {self.path}: it belongs to other inputs, settings or gpuflow version;"
                " starting over",
                flush=True,
            )
            return None
        elapsed = state.get("elapsed_s", 0.0)
        self.earlier_s = float(elapsed) if isinstance(elapsed, int | float) else 0.0
        return state["data"]

    def _mention_legacy(self) -> None:
        """Say that a state an older gpuflow left is ignored (a legacy seed log goes)."""
        out = self.first_output
        for old in (
            out.with_name(f".{out.name}.resume.pt"),
            out.with_name(f".{out.stem}.resume.pt"),
            out.parent / "train_state.pt",
            out.parent.parent / "train_state.pt",
        ):
            if old.is_file():
                print(
                    f"ignoring {old}: a resume state of an older gpuflow (states now live in"
                    f" {self.path.parent}/); starting over",
                    flush=True,
                )
                return
        for suffix in ("units.jsonl", "seeds.jsonl"):
            log = self.path.with_name(f"{out.name}.{suffix}")
            if log.is_file():
                print(f"ignoring {log}: a seed log of an older gpuflow; starting over", flush=True)
                log.unlink()

    def save(self, data: Mapping[str, Any]) -> None:
        """Write `data` with the fingerprint atomically (a kill mid-write keeps the last one)."""
        from gpuflow.job.atomic import save_torch

        save_torch(
            self.path,
            {
                "fingerprint": self.fingerprint,
                "gpuflow": gpuflow.__version__,
                "elapsed_s": self.earlier_s + time.monotonic() - self.started,
                "data": dict(data),
            },
        )


def load_optimizer_state(optimizer: Any, state: dict[str, Any]) -> None:
    """Load a saved optimizer state under this run's kernel choice."""
    groups = [
        {**saved, "fused": live["fused"]}
        for saved, live in zip(state["param_groups"], optimizer.param_groups, strict=True)
    ]
    optimizer.load_state_dict({**state, "param_groups": groups})
