"""Read users' text files (CSV, TSV, JSONL) with errors that name the file, row and problem."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import pandas as pd

from gpuflow.data.delimited import decode_utf8, records
from gpuflow.errors import DataError

FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl"}


def read_text_file(path: str | Path) -> pd.DataFrame:
    """A table of strings from a CSV, TSV or JSONL file; rows are numbered as in the file."""
    file = Path(path)
    if not file.is_file():
        raise DataError(file, "no such file")
    kind = FORMATS.get(file.suffix.lower())
    if kind is None:
        raise DataError(
            file, f"unknown file type {file.suffix!r}", expected=f"one of {sorted(FORMATS)}"
        )
    content = decode_utf8(file, file.read_bytes(), expected="a text file saved as UTF-8")
    if kind == "jsonl":
        return _read_jsonl(file, content)
    return _read_delimited(file, content, kind)


def _read_delimited(file: Path, content: str, kind: Literal["csv", "tsv"]) -> pd.DataFrame:
    read = records(file, content, kind, rows="records")
    if not read:
        raise DataError(file, "the file is empty", expected="a header row and data rows")
    header = read[0][1]
    _check_header(file, header)
    table, rows = [], []
    for number, fields in read[1:]:
        if not fields:
            continue
        if len(fields) != len(header):
            raise DataError(
                file,
                f"{len(fields)} fields where the header has {len(header)}",
                row=number,
            )
        table.append(fields)
        rows.append(number)
    if not table:
        raise DataError(file, "no rows below the header", expected="a header row and data rows")
    return pd.DataFrame(table, columns=header, index=pd.Index(rows, name="row"), dtype=object)


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
