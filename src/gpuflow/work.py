"""What a job costs, as data: the interface between the families and the cost engine."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import gpuflow
from gpuflow.errors import GpuflowError

STARTUP = "startup"  # a process start: Python, gpuflow's command line and its shape's imports
COUNTS = Path(".snakemake") / "gpuflow" / "counts"  # in the run's folder
_counted: dict[str, Any] = {}


class NotHere(GpuflowError):
    """A job's work cannot be counted here: its inputs (`missing`) are not on this machine."""

    def __init__(self, missing: list[str]):
        super().__init__(f"not here: {', '.join(missing)}")


@dataclass(frozen=True)
class Term:
    """`amount` of work of `kind` at `shape`, `what` in words, shared by `parallel` devices."""

    kind: str
    amount: float
    shape: str = ""
    what: str = ""
    parallel: int = 1


@dataclass(frozen=True)
class Work:
    """The terms of one job, the saved units it is cut into, and notes on estimates."""

    terms: tuple[Term, ...]
    units: int = 1
    unit: str = "job"
    notes: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "notes": list(self.notes)}

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> Work:
        """The work `as_dict` wrote (a record's job row)."""
        terms = tuple(Term(**term) for term in value["terms"])
        return cls(terms, int(value["units"]), str(value["unit"]), tuple(value.get("notes", ())))


@dataclass(frozen=True)
class Need:
    """A kind of work at one shape that a planned job needs, with that job's context."""

    term: Term
    rule: str
    config: dict[str, Any]
    wildcards: dict[str, str]
    threads: int
    device: str  # "cpu" or "cuda": where the job's work runs
    folder: Path  # the run folder (state writes land on its disk)


@dataclass
class Trial:
    """One measurement of a family's own step at a job's shape: `run()` returns a rate."""

    kind: str
    unit: str
    what: str
    run: Callable[[], float]
    close: Callable[[], None] | None = None
    threads: int | None = None


def startup(*modules: str, processes: int = 1, at_once: bool = False) -> Term:
    """The start of `processes` processes that import `modules`."""
    shape = "+".join(modules)
    what = f"{processes} processes importing {shape}" if processes > 1 else f"import {shape}"
    return Term(STARTUP, float(processes), shape, what, processes if at_once else 1)


def count(value: float) -> str:
    """A count in words: 1,234 / 12.3 k / 4.56 M / 7.89 G ... as numbers are read in a plan."""
    for size, suffix in ((1e15, " P"), (1e12, " T"), (1e9, " G"), (1e6, " M"), (1e3, " k")):
        if abs(value) >= size:
            return f"{value / size:.3g}{suffix}"
    return f"{value:.3g}"


@cache
def file_facts(path: str, folder: str) -> str:
    """A cheap digest of what identifies a file's or folder's content, once per process."""
    digest = hashlib.sha256()
    full = os.path.join(folder, path)
    pending = [full] if os.path.isdir(full) else []
    if not pending:
        try:
            stat = os.stat(full)
            digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
        except OSError:
            digest.update(f"{path}\0not here".encode())
    while pending:
        here = pending.pop()
        digest.update(f"{here}\0{os.stat(here).st_mtime_ns}\n".encode())
        for entry in sorted(os.scandir(here), key=lambda entry: entry.name):
            if entry.is_dir():
                pending.append(entry.path)
            else:
                digest.update(f"{entry.name}\0{entry.inode()}\n".encode())
    return digest.hexdigest()


def counted(
    name: str, settings: Any, files: Iterable[str | Path], compute: Callable[[], Any]
) -> Any:
    """`compute()` of what `settings` select from `files`, counted once and kept in COUNTS."""
    facts = [file_facts(str(path), os.getcwd()) for path in files]
    key = json.dumps([name, settings, facts, gpuflow.__version__], sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    path = Path.cwd() / COUNTS / f"{name}-{digest}.json"
    if str(path) in _counted:
        return _counted[str(path)]
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        value = json.loads(json.dumps(compute()))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary = path.with_name(f".{path.name}.{os.getpid()}")
            temporary.write_text(json.dumps(value), encoding="utf-8")
            os.replace(temporary, path)
        except OSError:
            pass  # a folder this process may not write: count again next time
    _counted[str(path)] = value
    return value
