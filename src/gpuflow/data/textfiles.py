"""Read users' text files (CSV, TSV, JSONL) with errors that name the file, row and problem."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pandas as pd

from gpuflow.errors import DataError

FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl"}


def read_text_file(path: str | Path) -> pd.DataFrame:
    """A table of strings from a CSV, TSV or JSONL file; rows are numbered as in the file.

    The index holds each record's row number: the line for JSONL, the data row (header = row 0)
    for CSV and TSV.
    """
    file = Path(path)
    if not file.is_file():
        raise DataError(file, "no such file")
    kind = FORMATS.get(file.suffix.lower())
    if kind is None:
        raise DataError(file, f"unknown file type {file.suffix!r}", f"one of {sorted(FORMATS)}")
    raw = file.read_bytes()
    try:
        content = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise DataError(file, f"bytes that are not UTF-8 text on line {line}", row=line) from None
    if kind == "jsonl":
        return _read_jsonl(file, content)
    return _read_delimited(file, content, "," if kind == "csv" else "\t")


def _read_delimited(file: Path, content: str, delimiter: str) -> pd.DataFrame:
    reader = csv.reader(io.StringIO(content), delimiter=delimiter)
    try:
        header = next(reader)
    except StopIteration:
        raise DataError(file, "the file is empty", expected="a header row and data rows") from None
    records, rows = [], []
    try:
        for number, fields in enumerate(reader, start=1):
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
    except csv.Error as error:
        raise DataError(
            file, f"malformed {'CSV' if delimiter == ',' else 'TSV'}: {error}"
        ) from None
    if not records:
        raise DataError(file, "no rows below the header", expected="a header row and data rows")
    return pd.DataFrame(records, columns=header, index=pd.Index(rows, name="row"), dtype=object)


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
    return pd.DataFrame(records, index=pd.Index(rows, name="row"), dtype=object)
