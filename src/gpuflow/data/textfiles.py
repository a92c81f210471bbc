"""Read users' text files (CSV, TSV, JSONL) with errors that name the file, row and problem."""

from __future__ import annotations

import codecs
import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from gpuflow.errors import DataError

FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl"}
CSV_QUOTING = '" to open and close a quoted field, "" for a quote inside one'


def read_text_file(path: str | Path) -> pd.DataFrame:
    """A table of strings from a CSV, TSV or JSONL file; rows are numbered as in the file.

    The index holds each record's row number: the line for JSONL, the data row (header = row 0)
    for CSV and TSV. A UTF-8 byte-order mark at the start is ignored.

    CSV is read strictly: a field may be quoted to hold commas, line breaks and "" for a quote,
    and a quote that opens a field must close it right before a comma or the line's end, so a
    stray or unclosed quote is an error, never rows merged into one field. TSV has no quoting
    (the text/tab-separated-values convention): each line is one row, a quote is an ordinary
    character, and a field cannot hold a tab or a line break. The header's column names must be
    non-empty and unique. In JSONL a key a record lacks reads as None, like a JSON null.
    """
    file = Path(path)
    if not file.is_file():
        raise DataError(file, "no such file")
    kind = FORMATS.get(file.suffix.lower())
    if kind is None:
        raise DataError(
            file, f"unknown file type {file.suffix!r}", expected=f"one of {sorted(FORMATS)}"
        )
    raw = file.read_bytes().removeprefix(codecs.BOM_UTF8)
    try:
        content = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise DataError(file, f"bytes that are not UTF-8 text on line {line}", row=line) from None
    if kind == "jsonl":
        return _read_jsonl(file, content)
    return _read_delimited(file, content, kind)


def _read_delimited(file: Path, content: str, kind: str) -> pd.DataFrame:
    rows_read = _delimited_rows(file, content, kind)
    header = next(rows_read, None)
    if header is None:
        raise DataError(file, "the file is empty", expected="a header row and data rows")
    _check_header(file, header)
    records, rows = [], []
    for number, fields in enumerate(rows_read, start=1):
        if not fields:
            continue
        if len(fields) != len(header):
            raise DataError(
                file,
                f"{len(fields)} fields where the header has {len(header)}",
                row=number,
            )
        records.append(fields)
        rows.append(number)
    if not records:
        raise DataError(file, "no rows below the header", expected="a header row and data rows")
    return pd.DataFrame(records, columns=header, index=pd.Index(rows, name="row"), dtype=object)


def _delimited_rows(file: Path, content: str, kind: str) -> Iterator[list[str]]:
    """The rows of a CSV or TSV text, header first; a malformed row names the lines it spans."""
    if kind == "csv":
        reader = csv.reader(io.StringIO(content), delimiter=",", strict=True)
    else:
        reader = csv.reader(io.StringIO(content), delimiter="\t", quoting=csv.QUOTE_NONE)
    number = 0
    while True:
        start = reader.line_num + 1
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as error:
            end = reader.line_num
            lines = f"line {start}" if end <= start else f"lines {start}-{end}"
            raise DataError(
                file,
                f"malformed {kind.upper()} on {lines}: {error}",
                row=number or None,
                expected=CSV_QUOTING if kind == "csv" else None,
            ) from None
        yield fields
        number += 1


def _check_header(file: Path, header: list[str]) -> None:
    """Every column of the header row has a name of its own."""
    expected = "a non-empty, unique name for every column"
    first: dict[str, int] = {}
    for position, name in enumerate(header, start=1):
        if not name.strip():
            raise DataError(
                file, f"the header row has no name for column {position}", expected=expected
            )
        if name in first:
            raise DataError(
                file,
                f"the header row names column {name!r} twice (columns {first[name]} and "
                f"{position})",
                expected=expected,
            )
        first[name] = position


def _read_jsonl(file: Path, content: str) -> pd.DataFrame:
    records, rows = [], []
    for number, line in enumerate(content.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataError(file, f"not valid JSON: {error.msg}", row=number) from None
        if not isinstance(record, dict):
            raise DataError(file, "a JSON line that is not an object", row=number)
        records.append(record)
        rows.append(number)
    if not records:
        raise DataError(file, "the file has no records", expected="one JSON object per line")
    columns = list(dict.fromkeys(key for record in records for key in record))
    return pd.DataFrame(
        [[record.get(key) for key in columns] for record in records],
        columns=columns,
        index=pd.Index(rows, name="row"),
        dtype=object,
    )
