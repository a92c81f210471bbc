"""Which attempt of a job may write: the newest one."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from pathlib import Path

from gpuflow.job.paths import ATTEMPT, job_file
from gpuflow.job.stopping import Stopped

_mine: tuple[Path, str] | None = None  # this process's attempt file and what it wrote there


class Superseded(Stopped):
    """A newer attempt of this job has started: this one stops and writes nothing more."""


def identity() -> str:
    """This attempt: SLURM job and restart count (or '-'), host, pid and start time."""
    job = os.environ.get("SLURM_JOB_ID", "-")
    restart = os.environ.get("SLURM_RESTART_COUNT", "0")
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    host, pid = socket.gethostname(), os.getpid()
    return f"SLURM job {job} restart {restart}, host {host}, pid {pid}, since {since}"


def claim(first_output: str | Path) -> None:
    """Name this process the job's newest attempt (in the job's attempt file)."""
    global _mine
    path = job_file(first_output, ATTEMPT)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = identity()
    written = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    written.write_text(text + "\n", encoding="utf-8")
    os.replace(written, path)
    _mine = (path, text)


def check() -> None:
    """Raise Superseded where a newer attempt has named itself since this one did."""
    if _mine is None:
        return
    path, text = _mine
    try:
        found = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return
    if found != text:
        raise Superseded(
            f"superseded by a newer attempt of this job ({found}): stopped without writing"
        )


def release() -> None:
    """The attempt ends: remove its attempt file where it still names it."""
    global _mine
    if _mine is not None:
        path, text = _mine
        _mine = None
        with contextlib.suppress(FileNotFoundError):
            if path.read_text(encoding="utf-8").strip() == text:
                path.unlink()
