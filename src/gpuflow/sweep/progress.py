"""A shard's progress file: one JSON line per finished seed, appended durably.

The first line records the settings; a file written for other settings is started over. Each
seed line is flushed and fsynced before the next seed is reported, so a job killed at any
moment loses at most the seeds still running. A torn last line (killed mid-write) is cut off.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, TextIO


def progress_path(out: str | Path) -> Path:
    """The progress file beside a shard's output: `shard~0.csv` -> `shard~0.progress.jsonl`."""
    out = Path(out)
    return out.with_name(f"{out.stem}.progress.jsonl")


class ProgressFile:
    """Durable record of the seeds a shard has finished (ok or failed)."""

    def __init__(self, path: str | Path, settings: dict[str, Any]):
        self.path = Path(path)
        self.settings = json.loads(json.dumps(settings, sort_keys=True))
        self.records: dict[int, dict[str, Any]] = {}
        self.started_over = False
        self._handle: TextIO | None = None

    def open(self) -> ProgressFile:
        """Read what an earlier run left (if written for the same settings), then open to append."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lines = self._read_whole_lines()
        header = json.loads(lines[0]) if lines else None
        if header is None or header.get("settings") != self.settings:
            self.started_over = bool(lines)
            self._handle = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 (closed by close())
            self._append({"kind": "header", "settings": self.settings})
            return self
        for line in lines[1:]:
            record = json.loads(line)
            self.records[record["seed"]] = record
        self._handle = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed by close())
        return self

    def _read_whole_lines(self) -> list[str]:
        if not self.path.exists():
            return []
        raw = self.path.read_bytes()
        whole = raw[: raw.rfind(b"\n") + 1]
        if len(whole) != len(raw):
            with open(self.path, "r+b") as handle:
                handle.truncate(len(whole))
        lines = [line for line in whole.decode("utf-8").splitlines() if line.strip()]
        try:
            if lines:
                json.loads(lines[0])
        except json.JSONDecodeError:
            return []
        return lines

    def done(self) -> dict[int, dict[str, Any]]:
        """Rows of the seeds finished successfully, by seed."""
        return {s: r["row"] for s, r in self.records.items() if r["status"] == "ok"}

    def add_ok(self, seed: int, row: dict[str, Any]) -> dict[str, Any]:
        """Record a finished seed durably; return the row as it reads back from the file."""
        record = json.loads(json.dumps({"kind": "seed", "seed": seed, "status": "ok", "row": row}))
        self._append(record)
        self.records[seed] = record
        return record["row"]

    def add_failed(self, seed: int, error: str) -> None:
        """Record a failed seed with its error (a re-run tries it again)."""
        record = {"kind": "seed", "seed": seed, "status": "failed", "error": error}
        self._append(record)
        self.records[seed] = record

    def _append(self, record: dict[str, Any]) -> None:
        assert self._handle is not None
        self._handle.write(json.dumps(record, sort_keys=True) + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        """Close the file (it stays beside the outputs for the next run)."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
