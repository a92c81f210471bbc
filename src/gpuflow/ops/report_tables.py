"""`gpuflow report-tables`: a family's summary CSV tables as one self-contained HTML page."""

from __future__ import annotations

import argparse
import html
from pathlib import Path

import pandas as pd

from gpuflow.errors import DataError
from gpuflow.job.atomic import write_text

STYLE = """
body { font-family: sans-serif; font-size: 13px; margin: 1em; }
h2 { font-size: 15px; margin: 1.2em 0 0.4em; }
table { border-collapse: collapse; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: right; }
th { background: #f0f0f0; position: sticky; top: 0; }
td:first-child, th:first-child { text-align: left; }
"""


def read_table(path: str | Path) -> pd.DataFrame:
    """A CSV table; one clear error line when it cannot be read."""
    try:
        return pd.read_csv(path)
    except FileNotFoundError:
        raise DataError(path, "no such file", expected="a summary CSV of the family") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as error:
        raise DataError(path, f"not a CSV table ({error})") from None


def page(title: str, tables: list[tuple[str, pd.DataFrame]]) -> str:
    """An HTML page with a heading and one table per (name, frame)."""
    parts = [
        "<!DOCTYPE html>",
        f'<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>',
        f"<style>{STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    for name, frame in tables:
        parts.append(f"<h2>{html.escape(name)} ({len(frame)} rows)</h2>")
        parts.append(frame.to_html(index=False, na_rep="", float_format=lambda v: f"{v:.4g}"))
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def main(args: argparse.Namespace) -> None:
    """Write the tables of `--csv` (headed by their file names) to `--out`."""
    tables = [(Path(path).name, read_table(path)) for path in args.csv]
    write_text(args.out, page(args.title, tables))
    print(f"{len(tables)} tables -> {args.out}")
