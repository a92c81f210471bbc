"""One writer per output: an exclusive lock beside each output, held while it is written."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from gpuflow.errors import WRITE_ERRNOS, GpuflowError, cannot_write

_held: dict[Path, IO[bytes]] = {}


class OutputTakenError(GpuflowError):
    """Another live process holds the lock of an output this process is about to write."""

    def __init__(self, output: Path, holder: str):
        self.output, self.holder = output, holder
        super().__init__(
            f"{output}: another job is writing this output ({holder}); two runs of the same"
            " target overlap (e.g. after `snakemake --unlock` while jobs of the earlier run"
            " still ran): let that job finish or cancel it, then run again"
        )


def lock_path(output: str | Path) -> Path:
    """The lock file of `output`: `.<name>.writer.lock` in the same folder."""
    output = Path(output)
    return output.with_name(f".{output.name}.writer.lock")


SINCE_FORMAT = "%Y-%m-%d %H:%M:%S"


def read_holder(output: str | Path) -> dict[str, str] | None:
    """The holder written in `output`'s lock file, by field; None without a lock file."""
    try:
        text = lock_path(output).read_text(encoding="utf-8")
    except OSError:
        return None
    parts = (part.strip() for part in text.strip().split(","))
    return dict(part.split(" ", 1) for part in parts if " " in part)


@contextmanager
def exclusive_output(output: str | Path) -> Iterator[None]:
    """Hold the lock of `output` (a no-op when this process holds it already)."""
    key = Path(os.path.abspath(output))
    if key in _held:
        yield
        return
    path = lock_path(key)
    handle = _take(path, Path(output))
    try:
        _record_holder(handle)
        _held[key] = handle
        yield
    finally:
        _held.pop(key, None)
        with contextlib.suppress(OSError):
            path.unlink()  # still holding it: a writer that opened this file sees it is stale
        handle.close()


def _take(path: Path, output: Path) -> IO[bytes]:
    """Open and lock `path`; retry when the file was removed by its last holder meanwhile."""
    while True:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handle = open(path, "a+b", buffering=0)  # noqa: SIM115 (held while the lock is)
        except OSError as error:
            if error.errno not in WRITE_ERRNOS:
                raise
            raise cannot_write(output, error) from error
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().decode("utf-8", "replace").strip() or "holder not recorded"
            handle.close()
            raise OutputTakenError(output, holder) from None
        with contextlib.suppress(FileNotFoundError):
            if os.fstat(handle.fileno()).st_ino == path.stat().st_ino:
                return handle
        handle.close()


def _record_holder(handle: IO[bytes]) -> None:
    """Write this process into the lock file (host, pid, SLURM job, since when)."""
    job = os.environ.get("SLURM_JOB_ID", "-")
    since = time.strftime(SINCE_FORMAT, time.localtime())
    holder = f"host {socket.gethostname()}, pid {os.getpid()}, SLURM job {job}, since {since}\n"
    handle.seek(0)
    handle.truncate()
    try:
        handle.write(holder.encode())
    except OSError as error:
        if error.errno not in WRITE_ERRNOS:
            raise


def step_outputs(args: argparse.Namespace) -> list[Path]:
    """The outputs a step writes: the values of the arguments its registration names."""
    found = []
    for name in getattr(args.run, "outputs", ()):
        value = getattr(args, name)
        for item in value if isinstance(value, list) else [value]:
            if item:
                found.append(Path(item))
    return found


def locks_this_process() -> bool:
    """False in the non-zero ranks of a torchrun job: rank 0 writes and holds the locks."""
    return os.environ.get("RANK", "0") == "0"
