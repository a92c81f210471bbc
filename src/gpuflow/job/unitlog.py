"""Unit logs: the resume state of a step whose units finish on their own, in any order and on
several workers (a sweep shard's seeds), where `State`'s one snapshot does not fit.

A job's unit log is `job_file(first output, "units.jsonl")`, one JSON line per finished unit,
appended durably. The first line holds the job's fingerprint (gpuflow.job.state.make_fingerprint:
its inputs' content, results settings, identity and the gpuflow version); a log with another
fingerprint, or one that cannot be read back, is started over with one line saying why. Each
unit line ({"unit", "status": ok | failed, "row" or "error", "elapsed_s"}) is flushed and fsynced
before the unit is reported, so a job killed at any moment loses at most the units still
running; a torn last line (killed mid-write) is cut off. `elapsed_s` is the job's seconds of
work up to that line over every attempt, so a resumed job still tells what it cost (`earlier_s`,
the job record's `earlier_attempts_s`, as a `State` does).

The log has one writer at a time: it is read, cut and appended only under the lock of the job's
first output (gpuflow.job.outputlock; the job holds it already when run through `gpuflow`), so a
second job on the same output fails instead of overwriting it. It is kept until the run has
accepted the outputs (gpuflow.job.finished_states), then goes with the other job files, so a
forced re-run computes every unit again.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, TextIO

from gpuflow.job.outputlock import exclusive_output
from gpuflow.job.paths import UNITS, job_file


class UnitLog:
    """Durable record of the units (ok or failed) the job writing `first_output` has finished."""

    def __init__(self, first_output: str | Path, fingerprint: str):
        self.first_output = Path(first_output)
        self.path = job_file(first_output, UNITS)
        self.fingerprint = fingerprint
        self.records: dict[int, dict[str, Any]] = {}
        self.started_over = False
        self.reason: str | None = None
        self.started = time.monotonic()
        self.earlier_s = 0.0  # what earlier attempts spent on the units read back
        self._handle: TextIO | None = None
        self._lock = ExitStack()

    def open(self) -> UnitLog:
        """Read what an earlier attempt left (when its fingerprint matches), then open to append.

        A log that cannot be read back (not UTF-8, a line that is not a unit record) or holds
        another fingerprint is started over, with why in `started_over` / `reason`.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock.enter_context(exclusive_output(self.first_output))
        self._drop_legacy()
        lines = self._read_whole_lines()
        try:
            fingerprint, records = self._parse(lines)
        except (ValueError, KeyError, TypeError) as error:
            fingerprint, records = None, {}
            self.reason = f"unreadable ({error}); earlier results dropped"
        else:
            if lines and fingerprint != self.fingerprint:
                self.reason = "written for other inputs, settings or gpuflow version"
        self.started_over = self.reason is not None
        if not lines or self.started_over:
            self._handle = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 (closed by close())
            self._append({"kind": "header", "fingerprint": self.fingerprint})
            return self
        self.records = records
        self.earlier_s = max(
            (float(r.get("elapsed_s", 0.0)) for r in records.values()), default=0.0
        )
        self._handle = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed by close())
        return self

    def _drop_legacy(self) -> None:
        """Remove the seed log an older gpuflow kept for this job (`<output>.seeds.jsonl`), which
        this one cannot resume from, with one line: nothing else would ever remove it."""
        legacy = self.path.with_name(f"{self.first_output.name}.seeds.jsonl")
        if legacy.is_file():
            print(f"ignoring {legacy}: a seed log of an older gpuflow; starting over", flush=True)
            legacy.unlink()

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
    def _parse(lines: list[bytes]) -> tuple[str | None, dict[int, dict[str, Any]]]:
        """The fingerprint and the unit records; ValueError/KeyError/TypeError on a bad line."""
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
            if record.get("kind") != "unit" or record.get("status") not in ("ok", "failed"):
                raise ValueError(f"line {number}: not a unit record")
            if record["status"] == "ok" and not isinstance(record.get("row"), dict):
                raise ValueError(f"line {number}: a finished unit without its row")
            if not isinstance(record.get("elapsed_s", 0.0), int | float):
                raise ValueError(f"line {number}: elapsed_s is not a number")
            records[int(record["unit"])] = record
        return header.get("fingerprint"), records

    def done(self) -> dict[int, dict[str, Any]]:
        """Rows of the units finished successfully, by unit."""
        return {u: r["row"] for u, r in self.records.items() if r["status"] == "ok"}

    def add_ok(self, unit: int, row: dict[str, Any]) -> dict[str, Any]:
        """Record a finished unit durably; return its row as it reads back from the file."""
        record = json.loads(json.dumps({**self._unit(unit, "ok"), "row": row}))
        self._append(record)
        self.records[unit] = record
        return record["row"]

    def add_failed(self, unit: int, error: str) -> None:
        """Record a failed unit with its error (a re-run tries it again)."""
        record = {**self._unit(unit, "failed"), "error": error}
        self._append(record)
        self.records[unit] = record

    def _unit(self, unit: int, status: str) -> dict[str, Any]:
        elapsed = self.earlier_s + time.monotonic() - self.started
        return {"kind": "unit", "unit": unit, "status": status, "elapsed_s": elapsed}

    def _append(self, record: dict[str, Any]) -> None:
        assert self._handle is not None
        self._handle.write(json.dumps(record, sort_keys=True) + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        """Close the file (it stays for the next attempt until the outputs are accepted) and
        free the lock."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        self._lock.close()
