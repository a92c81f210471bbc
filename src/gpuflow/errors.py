"""Errors a user can fix: the CLI prints them as one clear message, without a traceback."""

from __future__ import annotations

import errno
from pathlib import Path

# Errors that say an output cannot be written where it should go (full, read-only, not a folder).
WRITE_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}
    | {errno.ENOTDIR, errno.EEXIST}
)


class GpuflowError(Exception):
    """Base class for problems in the user's config, data or environment."""


class ConfigError(GpuflowError):
    """A config value is wrong: names the key, the problem and what is expected."""

    def __init__(self, key: str, problem: str, expected: str | None = None):
        self.key, self.problem, self.expected = key, problem, expected
        suffix = f" (expected {expected})" if expected else ""
        super().__init__(f"config key '{key}': {problem}{suffix}")


class DataError(GpuflowError):
    """A data file is wrong: names the file, the row when there is one, and the problem."""

    def __init__(
        self, path: str | Path, problem: str, row: int | None = None, expected: str | None = None
    ):
        self.path, self.problem, self.row, self.expected = Path(path), problem, row, expected
        where = f"{path}" if row is None else f"{path}, row {row}"
        suffix = f" (expected {expected})" if expected else ""
        super().__init__(f"{where}: {problem}{suffix}")


def cannot_write(target: str | Path, error: OSError) -> DataError:
    """The one-line error for an output that cannot be written where it should go."""
    problem = (
        "a part of its folder path is a file, not a folder"
        if error.errno in (errno.ENOTDIR, errno.EEXIST)
        else error.strerror or str(error)
    )
    return DataError(
        target,
        f"cannot write the output ({problem})",
        expected="a writable output folder with free space",
    )
