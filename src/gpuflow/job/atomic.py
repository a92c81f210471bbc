"""Atomic outputs: write to a hidden temporary name beside the target, rename on success."""

from __future__ import annotations

import glob
import json
import os
import secrets
import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from gpuflow.errors import WRITE_ERRNOS, cannot_write
from gpuflow.job import attempt
from gpuflow.job.outputlock import exclusive_output

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure


def _temporary_sibling(path: Path) -> Path:
    host = socket.gethostname().replace("/", "_")
    return path.with_name(f".{path.name}.tmp-{host}-{os.getpid()}-{secrets.token_hex(4)}")


def _writer_alive(temporary: Path) -> bool:
    """Whether the process that made `temporary` still runs (known only on this host)."""
    try:
        host_part, pid, _ = temporary.name.rsplit("-", 2)
        pid_number = int(pid)
    except ValueError:
        return False  # an older name (pid only): its writer held no lock we now hold
    if not host_part.endswith(f".tmp-{socket.gethostname().replace('/', '_')}"):
        return False  # another host: the lock we hold proves its writer is gone
    return pid_number != os.getpid() and psutil.pid_exists(pid_number)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _replace_folder(new: Path, target: Path) -> None:
    """Put folder `new` in the place of folder `target`, never leaving a half-deleted one."""
    old = _temporary_sibling(target)
    os.replace(target, old)
    os.replace(new, target)
    shutil.rmtree(old)


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path to write (a file or a folder); it replaces `path` on success."""
    target = Path(path)
    tmp = _temporary_sibling(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with exclusive_output(target):
            for stale in target.parent.glob(f".{glob.escape(target.name)}.tmp-*"):
                if not _writer_alive(stale):
                    _remove(stale)
            yield tmp
            if tmp.is_file():
                with open(tmp, "rb") as handle:
                    os.fsync(handle.fileno())
            attempt.check()  # a newer attempt of this job writes from now on: leave it be
            if target.is_dir() and tmp.is_dir():
                _replace_folder(tmp, target)
            else:
                os.replace(tmp, target)
    except OSError as error:
        if error.errno not in WRITE_ERRNOS:
            raise
        raise cannot_write(target, error) from error
    except RuntimeError as error:  # torch.save hides the OSError of a full disk (see save_torch)
        cause = _write_error_inside(error)
        if cause is None:
            raise
        raise cannot_write(target, cause) from error
    finally:
        _remove(tmp)


def _write_error_inside(error: BaseException) -> OSError | None:
    """The write OSError (full disk, quota, read-only) that `error` was raised while handling."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in WRITE_ERRNOS:
            return current
        current = current.__cause__ or current.__context__
    return None


def save_torch(path: str | Path, obj: Any) -> None:
    """`torch.save` atomically, through a Python file so a full disk is one clear line."""
    import torch

    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        torch.save(obj, handle)


def write_text(path: str | Path, text: str) -> None:
    """Write text atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | Path, obj: Any) -> None:
    """Write an object as indented JSON, atomically."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")


def write_csv(path: str | Path, frame: pd.DataFrame) -> None:
    """Write a data frame as CSV without its index, atomically."""
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False)


def save_figure(path: str | Path, figure: Figure, dpi: int = 120) -> None:
    """Save a matplotlib figure atomically, in the format the file name says."""
    target = Path(path)
    with atomic_path(target) as tmp:
        figure.savefig(tmp, dpi=dpi, bbox_inches="tight", format=target.suffix.lstrip("."))


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
