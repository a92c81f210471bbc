"""Labelled texts for the classifier: the embedded movie reviews, or IMDB / AG News user files."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpuflow.data.delimited import decode_utf8, records
from gpuflow.data.embedded import load_movie_reviews
from gpuflow.errors import ConfigError, DataError
from gpuflow.job import write_csv, write_json
from gpuflow.settings.blocks import configuration, family_settings

IMDB_TEXT_COLUMNS = ("text", "review")
IMDB_LABEL_COLUMNS = ("label", "sentiment")
IMDB_LABELS = {"neg": 0, "negative": 0, "0": 0, "pos": 1, "positive": 1, "1": 1}
SENTIMENT_NAMES = ["negative", "positive"]
AG_NEWS_NAMES = {1: "World", 2: "Sports", 3: "Business", 4: "Sci/Tech"}
AG_NEWS_CLASSES = {str(k) for k in AG_NEWS_NAMES}
AG_NEWS_CLASS_COLUMNS = ("class index", "class", "label")


def load_imdb_folder(folder: Path) -> pd.DataFrame:
    """Reviews of an aclImdb split folder (`pos/*.txt`, `neg/*.txt`), in file-name order."""
    rows = []
    for name, label in (("neg", 0), ("pos", 1)):
        sub = folder / name
        if not sub.is_dir():
            raise DataError(folder, f"no '{name}' folder", expected="aclImdb layout: pos/ and neg/")
        for path in sorted(sub.glob("*.txt")):
            rows.append((path.read_text(encoding="utf-8", errors="replace"), label))
    if not rows:
        raise DataError(folder, "no review files", expected="pos/*.txt and neg/*.txt")
    return pd.DataFrame(rows, columns=["text", "label"])


def read_csv_rows(path: Path) -> list[tuple[int, list[str]]]:
    """(row, fields) of each non-blank record of a UTF-8 CSV, row = the line it starts on."""
    text = decode_utf8(path, path.read_bytes(), expected="a UTF-8 CSV")
    return [
        (row, fields)
        for row, fields in records(path, text, "csv", rows="lines")
        if len(fields) > 1 or (fields and fields[0].strip())
    ]


def check_widths(path: Path, rows: list[tuple[int, list[str]]], width: int, expected: str) -> None:
    """Every row has `width` fields, else a DataError naming the first row that has not."""
    for row, fields in rows:
        if len(fields) != width:
            count = f"{len(fields)} column" + ("" if len(fields) == 1 else "s")
            raise DataError(path, count, row=row, expected=expected)


def imdb_label(value: str) -> int | None:
    """The class of an IMDB label (pos/positive/1 or neg/negative/0, any case), None if unknown."""
    word = value.strip().lower()
    if word in IMDB_LABELS:
        return IMDB_LABELS[word]
    try:
        number = int(word)
    except ValueError:
        return None
    return number if number in (0, 1) else None


def load_imdb_csv(path: Path) -> pd.DataFrame:
    """Reviews of an IMDB CSV: a header line, then at least one review a row."""
    rows = read_csv_rows(path)
    if not rows:
        raise DataError(path, "empty file", expected="a header line, then one review a row")
    (_, header), body = rows[0], rows[1:]
    text = next((header.index(c) for c in IMDB_TEXT_COLUMNS if c in header), None)
    label = next((header.index(c) for c in IMDB_LABEL_COLUMNS if c in header), None)
    if text is None or label is None:
        raise DataError(
            path,
            f"columns {header}",
            row=rows[0][0],
            expected=f"a text column {IMDB_TEXT_COLUMNS} and a label column {IMDB_LABEL_COLUMNS}",
        )
    if not body:
        raise DataError(path, "no data rows", expected="at least one review after the header")
    check_widths(path, body, len(header), f"{len(header)}, as in the header")
    texts, labels = [], []
    for row, fields in body:
        value = imdb_label(fields[label])
        if value is None:
            problem = f"label {fields[label]!r}" if fields[label].strip() else "empty label"
            raise DataError(path, problem, row=row, expected="pos/positive/1 or neg/negative/0")
        if not fields[text].strip():
            raise DataError(path, "empty text", row=row)
        texts.append(fields[text])
        labels.append(value)
    return pd.DataFrame({"text": texts, "label": np.array(labels, dtype=np.int64)})


def load_imdb(path: Path) -> pd.DataFrame:
    """IMDB reviews from an aclImdb split folder or a CSV file."""
    if path.is_dir():
        return load_imdb_folder(path)
    if path.is_file():
        return load_imdb_csv(path)
    raise DataError(path, "no such file or folder", expected="an aclImdb folder or a CSV")


def is_ag_news_header(fields: list[str]) -> bool:
    """Whether an AG News first line is a header: its first field names the class column."""
    name = " ".join(fields[0].replace("_", " ").replace("-", " ").split()).lower()
    return name in AG_NEWS_CLASS_COLUMNS


def load_ag_news(path: Path) -> pd.DataFrame:
    """AG News rows `class,title,description` (class 1..4), with or without a header line."""
    if not path.is_file():
        raise DataError(path, "no such file", expected="an AG News CSV: class,title,description")
    rows = read_csv_rows(path)
    if not rows:
        raise DataError(path, "empty file", expected="AG News rows: class,title,description")
    check_widths(path, rows, 3, "3: class,title,description")
    first = rows[0][0]
    if is_ag_news_header(rows[0][1]):
        rows = rows[1:]
    if not rows:
        raise DataError(path, "no data rows", expected="at least one news row after the header")
    texts, labels = [], []
    for row, (klass, title, description) in rows:
        if klass.strip() not in AG_NEWS_CLASSES:
            header = ", or a header line whose first column is Class Index, class or label"
            raise DataError(
                path,
                f"class {klass.strip()!r}",
                row=row,
                expected="a class index 1..4" + (header if row == first else ""),
            )
        texts.append((title.strip() + ". " + description.strip()).replace("\\", " "))
        labels.append(int(klass) - 1)
    return pd.DataFrame({"text": texts, "label": np.array(labels, dtype=np.int64)})


def take(frame: pd.DataFrame, n: int | None, key: str) -> pd.DataFrame:
    """The first `n` rows (all when n is None); too few rows is a config error."""
    if n is not None and n > len(frame):
        raise ConfigError(key, f"{n} rows asked, only {len(frame)} available")
    return frame.iloc[:n].reset_index(drop=True)


def shuffled(frame: pd.DataFrame, seed: int) -> pd.DataFrame:
    """Rows in a random order drawn from `seed`."""
    order = np.random.default_rng(seed).permutation(len(frame))
    return frame.iloc[order].reset_index(drop=True)


def build_splits(
    settings: dict[str, Any], key: str = "data"
) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """(train, validation, label names) for one configuration's `data` settings."""
    source, seed = settings["source"], settings["seed"]
    held_out = None
    if source == "embedded":
        frame = load_movie_reviews(settings["corpus"])[["text", "label"]]
        names = SENTIMENT_NAMES
    else:
        if not settings.get("path"):
            raise ConfigError(f"{key}.path", f"required when source is {source!r}")
        path = Path(settings["path"])
        load = load_imdb if source == "imdb" else load_ag_news
        names = SENTIMENT_NAMES if source == "imdb" else list(AG_NEWS_NAMES.values())
        val_path = settings.get("val_path")
        if val_path is None and source == "imdb" and (path / "train").is_dir():
            path, val_path = path / "train", path / "test"
        frame = load(path)
        held_out = load(Path(val_path)) if val_path else None
    if held_out is None:
        frame = shuffled(frame, seed)
        n_val = settings["n_val"] or max(1, round(settings["val_fraction"] * len(frame)))
        val, train = frame.iloc[:n_val], frame.iloc[n_val:]
    else:
        train, val = shuffled(frame, seed), shuffled(held_out, seed + 1)
    train = take(train, settings["n_train"], f"{key}.n_train")
    val = take(val, settings["n_val"], f"{key}.n_val")
    if train["label"].nunique() < 2:
        raise ConfigError(key, "the training split has fewer than two classes")
    return train, val, names


def main(args: argparse.Namespace) -> None:
    """`gpuflow scaling-data`: write the training and validation splits of one configuration."""
    settings = configuration(family_settings("scaling", args.settings), args.name)["data"]
    train, val, names = build_splits(settings, key=f"scaling.configurations.{args.name}.data")
    write_csv(args.out_train, train)
    write_csv(args.out_val, val)
    write_json(
        args.out_info,
        {
            "source": settings["source"],
            "corpus": settings.get("corpus") if settings["source"] == "embedded" else None,
            "path": settings.get("path"),
            "n_train": len(train),
            "n_val": len(val),
            "n_classes": len(names),
            "label_names": names,
            "train_label_counts": train["label"].value_counts().sort_index().tolist(),
            "mean_words_train": float(train["text"].str.split().str.len().mean()),
        },
    )
    print(f"train {len(train)} rows, validation {len(val)} rows, {len(names)} classes")
