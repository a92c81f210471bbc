"""What Snakemake records in `.snakemake/`: incomplete markers, metadata and its run logs."""

from __future__ import annotations

import json
import os
import re
from base64 import urlsafe_b64decode, urlsafe_b64encode
from dataclasses import dataclass, field
from pathlib import Path

NAME_MAX = 255


@dataclass(frozen=True)
class Marker:
    """An output Snakemake marked incomplete: its job started (mtime) and has not finished."""

    output: str
    started: float
    external_jobid: str | None


@dataclass
class FailedJob:
    """A job the latest run log reports as failed ("Error in rule ...")."""

    rule: str
    output: list[str]
    log: list[str] = field(default_factory=list)
    external_jobid: str | None = None
    message: str = ""


def _decode(relative: str) -> str | None:
    """The output path a record file stands for (its name is url-safe base64, split by '@')."""
    parts = relative.split(os.sep)
    try:
        return urlsafe_b64decode("".join(p.lstrip("@") for p in parts)).decode()
    except (ValueError, UnicodeDecodeError):
        return None


def incomplete_markers(directory: str | Path) -> dict[str, Marker]:
    """Outputs of jobs that started and have not finished (or were killed), by output path."""
    root = Path(directory) / ".snakemake" / "incomplete"
    markers = {}
    for path, _, names in os.walk(root):
        for name in names:
            full = Path(path) / name
            output = _decode(os.path.relpath(full, root))
            if output is None:
                continue
            try:
                record = json.loads(full.read_text(encoding="utf-8") or "{}")
                started = full.stat().st_mtime
            except (OSError, ValueError):
                continue
            jobid = record.get("external_jobid") if isinstance(record, dict) else None
            markers[output] = Marker(output, started, str(jobid) if jobid else None)
    return markers


def record_path(folder: Path, output: str) -> Path:
    """Where Snakemake keeps the record of `output` (as its persistence module names it)."""
    name = urlsafe_b64encode(output.encode()).decode()
    parts = [name[i : i + NAME_MAX - 1] for i in range(0, len(name), NAME_MAX - 1)]
    return folder.joinpath(*["@" + part for part in parts[:-1]], parts[-1])


def metadata_times(directory: str | Path, output: str) -> tuple[float, float] | None:
    """(start, end) unix times Snakemake recorded for the job that wrote `output`."""
    path = record_path(Path(directory) / ".snakemake" / "metadata", output)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        return float(record["starttime"]), float(record["endtime"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def locked_since(directory: str | Path) -> float | None:
    """When Snakemake locked the working directory (a run, or a killed one), None if unlocked."""
    times = []
    for path in (Path(directory) / ".snakemake" / "locks").glob("*.lock"):
        try:
            times.append(path.stat().st_mtime)
        except OSError:
            continue
    return min(times) if times else None


def snakemake_alive(directory: str | Path) -> bool:
    """Whether a Snakemake process on this host works in `directory` (its cwd, Linux /proc)."""
    here = os.path.realpath(directory)
    for entry in Path("/proc").glob("[0-9]*"):
        if entry.name == str(os.getpid()):
            continue
        try:
            if os.readlink(entry / "cwd") != here:
                continue
            argv = (entry / "cmdline").read_bytes().split(b"\0")[:2]
        except OSError:
            continue
        if any(os.path.basename(arg).startswith(b"snakemake") for arg in argv):
            return True
    return False


RAN_JOBS = ("Select jobs to execute", "Error in rule", "has been submitted with SLURM jobid")


def latest_run_log(directory: str | Path) -> Path | None:
    """The newest log of a run that ran jobs (dry runs, --unlock, --lint, --report skipped)."""
    folder = Path(directory) / ".snakemake" / "log"
    for path in sorted(folder.glob("*.snakemake.log"), reverse=True):
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        ran = any(mark in text for mark in RAN_JOBS)
        if ran and "This was a dry-run" not in text:
            return path
    return None


FIELD = re.compile(r"^    (message|output|log|external_jobid): (.*)$")


def failed_jobs(log: Path | None) -> list[FailedJob]:
    """The jobs a run log reports with "Error in rule <rule>:", in order, last report wins."""
    if log is None:
        return []
    failed: dict[tuple[str, ...], FailedJob] = {}
    current: FailedJob | None = None
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        start = re.match(r"^Error in rule (\S+):$", line)
        if start:
            current = FailedJob(rule=start[1], output=[])
            continue
        if current is None:
            continue
        match = FIELD.match(line)
        if match is None:
            if not line.startswith("    "):
                failed[tuple(current.output) or (current.rule,)] = current
                current = None
            continue
        key, value = match[1], match[2].strip()
        if key == "output":
            current.output = [v.strip() for v in value.split(", ") if v.strip()]
        elif key == "log":
            value = value.split(" (check log file")[0]
            current.log = [v.strip() for v in value.split(", ") if v.strip()]
        elif key == "external_jobid":
            current.external_jobid = value
        else:
            current.message = "" if value == "None" else value
    if current is not None:
        failed[tuple(current.output) or (current.rule,)] = current
    return list(failed.values())


ERROR_WORDS = re.compile(r"error|exception|traceback|killed|cancelled|failed", re.IGNORECASE)


def last_error_line(paths: list[str], directory: str | Path) -> tuple[str | None, str]:
    """(log path, its last line naming an error, else its last line) of the first readable log."""
    for name in paths:
        path = Path(name) if os.path.isabs(name) else Path(directory) / name
        try:
            lines = [
                line.strip()
                for line in path.read_text(encoding="utf-8", errors="replace").splitlines()
                if line.strip()
            ]
        except OSError:
            continue
        errors = [line for line in lines if ERROR_WORDS.search(line)]
        return name, (errors or lines or [""])[-1]
    return (paths[0] if paths else None), ""
