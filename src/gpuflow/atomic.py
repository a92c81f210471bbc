"""Atomic outputs: write to a hidden temporary name beside the target, rename on success.

A failed or killed job therefore never leaves a file (or folder) that looks complete. The next
write of the same output removes what a killed writer left behind.
"""

from __future__ import annotations

import errno
import glob
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuflow.errors import DataError

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure


# Errors that say the output cannot be written where it should go (full, read-only, not a folder).
WRITE_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}
    | {errno.ENOTDIR, errno.EEXIST}
)


def _temporary_sibling(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path to write (a file or a folder); it replaces `path` on success."""
    target = Path(path)
    tmp = _temporary_sibling(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        for stale in target.parent.glob(f".{glob.escape(target.name)}.tmp-*"):
            _remove(stale)  # left by a writer that was killed (one job writes an output)
        yield tmp
        if tmp.is_file():
            _fsync_file(tmp)
        if target.is_dir() and tmp.is_dir():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except OSError as error:
        if error.errno not in WRITE_ERRNOS:
            raise
        problem = (
            "a part of its folder path is a file, not a folder"
            if error.errno in (errno.ENOTDIR, errno.EEXIST)
            else error.strerror or str(error)
        )
        raise DataError(
            target,
            f"cannot write the output ({problem})",
            expected="a writable output folder with free space",
        ) from error
    finally:
        _remove(tmp)


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
