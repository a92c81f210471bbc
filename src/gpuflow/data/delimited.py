"""Strict reading of users' delimited text (CSV, TSV): every problem names the file and row."""

from __future__ import annotations

import codecs
import csv
import io
from pathlib import Path
from typing import Literal

from gpuflow.errors import DataError

CSV_QUOTING = '" to open and close a quoted field, "" for a quote inside one'


def decode_utf8(path: Path, data: bytes, expected: str) -> str:
    """`data` (the bytes of `path`) as text, without a BOM; non-UTF-8 bytes are a DataError."""
    body = data.removeprefix(codecs.BOM_UTF8)
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as error:
        line = body[: error.start].count(b"\n") + 1
        offset = error.start + len(data) - len(body)
        raise DataError(
            path,
            f"not UTF-8 text on line {line} (byte {offset} is {body[error.start]:#04x})",
            expected=expected,
        ) from None


def records(
    path: Path, text: str, kind: Literal["csv", "tsv"], rows: Literal["lines", "records"]
) -> list[tuple[int, list[str]]]:
    """(row, fields) of every record of a CSV or TSV text, blank lines included (no fields)."""
    if kind == "csv":
        reader = csv.reader(io.StringIO(text, newline=""), delimiter=",", strict=True)
    else:
        reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t", quoting=csv.QUOTE_NONE)
    found: list[tuple[int, list[str]]] = []
    limit = csv.field_size_limit()
    csv.field_size_limit(max(limit, len(text) + 1))
    try:
        while True:
            start, count = reader.line_num + 1, len(found)
            row = start if rows == "lines" else count
            try:
                fields = next(reader)
            except StopIteration:
                return found
            except csv.Error as error:
                end = reader.line_num
                lines = f"line {start}" if end <= start else f"lines {start}-{end}"
                raise DataError(
                    path,
                    f"malformed {kind.upper()} on {lines}: {error}",
                    row=row or None,
                    expected=CSV_QUOTING if kind == "csv" else None,
                ) from None
            found.append((row, fields))
    finally:
        csv.field_size_limit(limit)
