"""Errors a user can fix: the CLI prints them as one clear message, without a traceback."""

from __future__ import annotations

from pathlib import Path


class GpuflowError(Exception):
    """Base class for problems in the user's config, data or environment."""


class ConfigError(GpuflowError):
    """A config value is wrong: names the key, the problem and what is expected."""

    def __init__(self, key: str, problem: str, expected: str | None = None):
        self.key, self.problem, self.expected = key, problem, expected
        message = f"config key '{key}': {problem}"
        if expected:
            message += f" (expected {expected})"
        super().__init__(message)


class DataError(GpuflowError):
    """A data file is wrong: names the file, the row when there is one, and the problem."""

    def __init__(
        self, path: str | Path, problem: str, row: int | None = None, expected: str | None = None
    ):
        self.path, self.problem, self.row, self.expected = Path(path), problem, row, expected
        where = f"{path}" if row is None else f"{path}, row {row}"
        message = f"{where}: {problem}"
        if expected:
            message += f" (expected {expected})"
        super().__init__(message)
