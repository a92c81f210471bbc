"""A shard's seed log, its resume state: one JSON line per finished seed, appended durably.

It is the job's `seeds.jsonl` file (gpuflow.job.paths); how far the shard is goes into the
job's progress file like every other step's.

The first line records the settings and the gpuflow version; a file written for other settings
or by another version is started over. Each seed line is flushed and fsynced before the next
seed is reported, so a job killed at any moment loses at most the seeds still running. A torn
last line (killed mid-write) is cut off. Each seed line carries `elapsed_s`, the shard's seconds
of work up to it over every attempt, so a resumed shard still tells what it cost (`earlier_s`,
the job record's `earlier_attempts_s`, as a `gpuflow.job.state.State` does). The file goes once
the shard's table is written, so a forced re-run (`--forcerun sweep_shard`) computes every seed
again (kept until the run has accepted the table, gpuflow.job.finished_states).
The file has one writer at a time: it is read, cut and appended only under the lock of the
shard's table (gpuflow.job.outputlock; the job holds it already when run through `gpuflow`), so a
second job on the same shard fails instead of overwriting it.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, TextIO

import gpuflow
from gpuflow.job.outputlock import exclusive_output
from gpuflow.job.paths import SEEDS, job_file


def seeds_path(out: str | Path) -> Path:
    """The seed log of the shard whose table is `out` (its job's `seeds.jsonl` file)."""
    return job_file(out, SEEDS)


class SeedLog:
    """Durable record of the seeds the shard writing table `out` has finished (ok or failed)."""

    def __init__(self, out: str | Path, settings: dict[str, Any]):
        self.out = Path(out)
        self.path = seeds_path(out)
        self.settings = json.loads(json.dumps(settings, sort_keys=True))
        self.records: dict[int, dict[str, Any]] = {}
        self.started_over = False
        self.reason: str | None = None
        self.started = time.monotonic()
        self.earlier_s = 0.0  # what earlier attempts spent on the seeds read back
        self._handle: TextIO | None = None
        self._lock = ExitStack()

    def open(self) -> SeedLog:
        """Read what an earlier run left (if written for the same settings), then open to append.

        A file that cannot be read back (not UTF-8, a line that is not a seed record) is
        reported in `started_over` / `reason` and started over, as is one for other settings.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock.enter_context(exclusive_output(self.out))
        lines = self._read_whole_lines()
        try:
            header, records = self._parse(lines)
        except (ValueError, KeyError, TypeError) as error:
            header, records = None, {}
            self.reason = f"unreadable ({error}); earlier results dropped"
        else:
            if lines and (header is None or header.get("settings") != self.settings):
                self.reason = "written for other settings"
            elif lines and header.get("version") != gpuflow.__version__:
                self.reason = f"written by gpuflow {header.get('version')}"
        if self.reason is not None:
            self.started_over = True
        if not lines or self.started_over:
            self._handle = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 (closed by close())
            self._append(
                {"kind": "header", "settings": self.settings, "version": gpuflow.__version__}
            )
            return self
        self.records = records
        self.earlier_s = max(
            (float(r.get("elapsed_s", 0.0)) for r in records.values()), default=0.0
        )
        self._handle = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed by close())
        return self

    def _read_whole_lines(self) -> list[bytes]:
        if not self.path.exists():
            return []
        raw = self.path.read_bytes()
        whole = raw[: raw.rfind(b"\n") + 1]
        if len(whole) != len(raw):
            with open(self.path, "r+b") as handle:
                handle.truncate(len(whole))
        return [line for line in whole.splitlines() if line.strip()]

    @staticmethod
    def _parse(lines: list[bytes]) -> tuple[dict[str, Any] | None, dict[int, dict[str, Any]]]:
        """The header and the seed records; ValueError/KeyError/TypeError when a line is bad."""
        if not lines:
            return None, {}
        parsed = []
        for number, line in enumerate(lines, 1):
            try:
                record = json.loads(line.decode("utf-8"))
            except ValueError as error:
                raise ValueError(f"line {number}: {error}") from None
            if not isinstance(record, dict):
                raise ValueError(f"line {number}: not a JSON object")
            parsed.append(record)
        header, records = parsed[0], {}
        if header.get("kind") != "header":
            raise ValueError("line 1: not a header")
        for number, record in enumerate(parsed[1:], 2):
            if record.get("kind") != "seed" or record.get("status") not in ("ok", "failed"):
                raise ValueError(f"line {number}: not a seed record")
            if record["status"] == "ok" and not isinstance(record.get("row"), dict):
                raise ValueError(f"line {number}: a finished seed without its row")
            if not isinstance(record.get("elapsed_s", 0.0), int | float):
                raise ValueError(f"line {number}: elapsed_s is not a number")
            records[int(record["seed"])] = record
        return header, records

    def done(self) -> dict[int, dict[str, Any]]:
        """Rows of the seeds finished successfully, by seed."""
        return {s: r["row"] for s, r in self.records.items() if r["status"] == "ok"}

    def add_ok(self, seed: int, row: dict[str, Any]) -> dict[str, Any]:
        """Record a finished seed durably; return the row as it reads back from the file."""
        record = json.loads(json.dumps({**self._seed(seed, "ok"), "row": row}))
        self._append(record)
        self.records[seed] = record
        return record["row"]

    def add_failed(self, seed: int, error: str) -> None:
        """Record a failed seed with its error (a re-run tries it again)."""
        record = {**self._seed(seed, "failed"), "error": error}
        self._append(record)
        self.records[seed] = record

    def _seed(self, seed: int, status: str) -> dict[str, Any]:
        elapsed = self.earlier_s + time.monotonic() - self.started
        return {"kind": "seed", "seed": seed, "status": status, "elapsed_s": elapsed}

    def _append(self, record: dict[str, Any]) -> None:
        assert self._handle is not None
        self._handle.write(json.dumps(record, sort_keys=True) + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        """Close the file (it stays for the next run until the table is accepted) and free the
        lock."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        self._lock.close()
