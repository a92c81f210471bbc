"""Where a job keeps its own files: one place per family, never beside its outputs."""

from __future__ import annotations

from pathlib import Path

JOBS = "jobs"
RECORD, PROGRESS, STATE = "record.json", "progress.json", "state.pt"
ATTEMPT = "attempt"  # the attempt that may write (gpuflow.job.attempt)
KINDS = (RECORD, PROGRESS, STATE, ATTEMPT)


def family_root(output: str | Path) -> Path:
    """The folder whose `jobs/` holds the files of a job writing `output` (docs/job-files.md)."""
    output = Path(output)
    for folder in output.parents:
        if folder.parent.name == "results":
            return folder
    return output.parent


def job_file(first_output: str | Path, kind: str) -> Path:
    """The `kind` file (one of KINDS) of the job whose first output is `first_output`."""
    if kind not in KINDS:
        raise ValueError(f"unknown job file kind {kind!r}: one of {KINDS}")
    output = Path(first_output)
    root = family_root(output)
    return root / JOBS / output.relative_to(root).parent / f"{output.name}.{kind}"


def job_of(path: str | Path, kind: str) -> str | None:
    """The first output whose `kind` file is `path`, or None when `path` is not one."""
    parts = Path(path).parts
    suffix = f".{kind}"
    if JOBS not in parts or not parts[-1].endswith(suffix):
        return None
    rest = parts[len(parts) - parts[::-1].index(JOBS) :]
    return str(Path(*rest))[: -len(suffix)] if rest else None
