"""Labelled texts for the classifier: the embedded movie reviews, or IMDB / AG News user files.

Every source becomes two tables with columns `text, label` (label = integer class 0..K-1):
a training split and a validation split, drawn with the configured seed.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpuflow.data.embedded import load_movie_reviews
from gpuflow.errors import ConfigError, DataError
from gpuflow.job.atomic import write_csv, write_json
from gpuflow.settings.blocks import configuration, family_settings

IMDB_TEXT_COLUMNS = ("text", "review")
IMDB_LABEL_COLUMNS = ("label", "sentiment")
IMDB_LABELS = {"neg": 0, "negative": 0, "0": 0, "pos": 1, "positive": 1, "1": 1}
SENTIMENT_NAMES = ["negative", "positive"]
AG_NEWS_NAMES = {1: "World", 2: "Sports", 3: "Business", 4: "Sci/Tech"}


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


def load_imdb_csv(path: Path) -> pd.DataFrame:
    """An IMDB CSV with a text column (`text` or `review`) and a label (`label` or `sentiment`)."""
    frame = pd.read_csv(path)
    text = next((c for c in IMDB_TEXT_COLUMNS if c in frame.columns), None)
    label = next((c for c in IMDB_LABEL_COLUMNS if c in frame.columns), None)
    if text is None or label is None:
        raise DataError(
            path,
            f"columns {list(frame.columns)}",
            expected=f"a text column {IMDB_TEXT_COLUMNS} and a label column {IMDB_LABEL_COLUMNS}",
        )
    labels = frame[label].astype(str).str.strip().str.lower()
    unknown = ~labels.isin(list(IMDB_LABELS))
    if unknown.any():
        row = int(np.flatnonzero(unknown.to_numpy())[0])
        raise DataError(
            path, f"label {frame[label].iloc[row]!r}", row=row + 2, expected="pos/neg, 1/0"
        )
    texts = frame[text]
    if texts.isna().any():
        row = int(np.flatnonzero(texts.isna().to_numpy())[0])
        raise DataError(path, "empty text", row=row + 2)
    return pd.DataFrame({"text": texts.astype(str), "label": labels.map(IMDB_LABELS)})


def load_imdb(path: Path) -> pd.DataFrame:
    """IMDB reviews from an aclImdb split folder or a CSV file."""
    if path.is_dir():
        return load_imdb_folder(path)
    if path.is_file():
        return load_imdb_csv(path)
    raise DataError(path, "no such file or folder", expected="an aclImdb folder or a CSV")


def load_ag_news(path: Path) -> pd.DataFrame:
    """AG News rows `class,title,description` (class 1..4), with or without a header line."""
    if not path.is_file():
        raise DataError(path, "no such file", expected="an AG News CSV: class,title,description")
    frame = pd.read_csv(path, header=None, dtype=str, keep_default_na=False)
    if frame.shape[1] != 3:
        raise DataError(path, f"{frame.shape[1]} columns", expected="3: class,title,description")
    if not frame.iloc[0, 0].strip().isdigit():
        frame = frame.iloc[1:]
    classes = frame[0].str.strip()
    bad = ~classes.isin([str(k) for k in AG_NEWS_NAMES])
    if bad.any():
        position = int(np.flatnonzero(bad.to_numpy())[0])
        raise DataError(
            path,
            f"class {classes.iloc[position]!r}",
            row=int(frame.index[position]) + 1,
            expected="a class index 1..4",
        )
    text = (frame[1].str.strip() + ". " + frame[2].str.strip()).str.replace("\\", " ")
    return pd.DataFrame({"text": text.to_numpy(), "label": classes.astype(int).to_numpy() - 1})


def take(frame: pd.DataFrame, n: int | None, key: str) -> pd.DataFrame:
    """The first `n` rows (all when n is None); too few rows is a config error."""
    if n is None:
        return frame.reset_index(drop=True)
    if n > len(frame):
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
