"""The texts to score: embedded movie reviews with word-shuffled twins, or the user's files."""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpuflow.data.embedded import load_movie_reviews
from gpuflow.data.textfiles import read_text_file
from gpuflow.errors import ConfigError, DataError
from gpuflow.job import write_csv
from gpuflow.settings.blocks import family_settings

_HTML_BREAK = re.compile(r"<br\s*/?>", re.IGNORECASE)


def clean_review(text: str, max_words: int | None = None) -> str:
    """A review as plain words: HTML line breaks removed, whitespace collapsed, cut to max_words."""
    words = _HTML_BREAK.sub(" ", text).split()
    return " ".join(words[:max_words] if max_words else words)


def shuffle_words(text: str, rng: np.random.Generator) -> str:
    """The same words in another order (a fluency-destroying twin with the same vocabulary)."""
    words = text.split()
    if len(set(words)) < 2:
        return text
    while True:
        shuffled = " ".join(words[i] for i in rng.permutation(len(words)))
        if shuffled != text:
            return shuffled


def embedded_texts(
    n_texts: int,
    corpus: list[str],
    max_words: int,
    seed: int,
    shuffled_twins: bool,
    min_words: int = 8,
) -> pd.DataFrame:
    """Original reviews drawn evenly from `corpus` sources, each optionally with a shuffled twin."""
    rng = np.random.default_rng(seed)
    per_source = np.array_split(np.arange(n_texts), len(corpus))
    rows = []
    for source, share in zip(corpus, per_source, strict=True):
        reviews = load_movie_reviews(source)
        cleaned = [clean_review(text, max_words) for text in reviews["text"]]
        eligible = [i for i, text in enumerate(cleaned) if len(text.split()) >= min_words]
        if len(eligible) < len(share):
            raise ConfigError(
                "fluency.texts.n_texts",
                f"{len(share)} {source} texts asked for, {len(eligible)} have {min_words} words",
            )
        picked = rng.choice(eligible, size=len(share), replace=False)
        for index in sorted(picked):
            text = cleaned[index]
            rows.append(
                {
                    "text_id": f"{source}-{index:05d}",
                    "text": text,
                    "source": source,
                    "condition": "original",
                    "pair_id": f"{source}-{index:05d}",
                }
            )
    frame = pd.DataFrame(rows)
    if shuffled_twins:
        twins = frame.copy()
        twins["text"] = [shuffle_words(t, rng) for t in frame["text"]]
        twins["text_id"] = frame["text_id"] + "-shuffled"
        twins["condition"] = "shuffled"
        frame = pd.concat([frame, twins], ignore_index=True)
    return frame


# The texts table's own columns and those the scores join and the statistics add to it.
RESERVED_COLUMNS = ("text_id", "text", "source", "condition")
SCORE_COLUMNS = ("nll_sum", "n_tokens", "ppl", "toxicity", "toxicity_scorer", "log_ppl")


def check_group_columns(group_columns: list[str]) -> None:
    """Group columns are listed once each and clash with no column the workflow writes."""
    key = "fluency.texts.group_columns"
    for position, column in enumerate(group_columns):
        if column in RESERVED_COLUMNS + SCORE_COLUMNS:
            raise ConfigError(
                key,
                f"{column!r} clashes with a column the workflow writes itself",
                f"names other than {', '.join(RESERVED_COLUMNS + SCORE_COLUMNS)}",
            )
        if column in group_columns[:position]:
            raise ConfigError(key, f"{column!r} is listed twice", "each column once")


def file_texts(
    paths: list[str], text_column: str, id_column: str | None, group_columns: list[str]
) -> pd.DataFrame:
    """Texts from the user's files, checked row by row; `source` is the file's name."""
    check_group_columns(group_columns)
    needed = list(dict.fromkeys([text_column, *([id_column] if id_column else []), *group_columns]))
    frames = []
    seen: dict[str, tuple[str, int]] = {}
    for path in paths:
        table = read_text_file(path)
        missing = [c for c in needed if c not in table.columns]
        if missing:
            raise DataError(
                path,
                f"missing column(s) {missing}; the file has {list(table.columns)}",
                expected=f"columns {needed}",
            )
        for row, value in table[text_column].items():
            if value is None:
                raise DataError(path, "no text", row=row, expected="non-empty text")
            if not isinstance(value, str):
                raise DataError(path, f"text is {type(value).__name__}, not a string", row=row)
            if not value.strip():
                raise DataError(path, "empty text", row=row, expected="non-empty text")
        raw_ids = (
            table[id_column]
            if id_column
            else pd.Series([f"{Path(path).stem}-{r}" for r in table.index], index=table.index)
        )
        ids = []
        for row, value in raw_ids.items():
            text_id = _text_id(path, row, value)
            if text_id in seen:
                first_path, first_row = seen[text_id]
                raise DataError(
                    path,
                    f"duplicate text id {text_id!r} (first at {first_path}, row {first_row})",
                    row=row,
                )
            seen[text_id] = (str(path), int(row))
            ids.append(text_id)
        frame = pd.DataFrame(
            {
                "text_id": ids,
                "text": table[text_column].to_numpy(),
                "source": Path(path).stem,
                "condition": "",
            }
        )
        for column in group_columns:
            frame[column] = table[column].map(group_label).to_numpy()
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def _text_id(path: str, row: int, value: object) -> str:
    """A text id as written: a non-blank string or an integer; a missing or null one is an error."""
    expected = "a non-blank text id (a string or an integer)"
    if value is None:
        raise DataError(path, "no text id", row=row, expected=expected)
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise DataError(
            path, f"text id {value!r} is {type(value).__name__}", row=row, expected=expected
        )
    if not str(value).strip():
        raise DataError(path, "blank text id", row=row, expected=expected)
    return str(value)


def group_label(value: object) -> str:
    """A group cell as written ("NA", "None" and "null" stay labels)."""
    return "" if value is None else str(value)


def texts_digest(text_ids: Sequence[Any], texts: Sequence[str]) -> str:
    """A hash of the texts and their ids, in order (what a scoring step's resume state is of)."""
    text = json.dumps([[str(i) for i in text_ids], list(texts)], ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def deal_into_shards(texts: pd.DataFrame, n_shards: int) -> list[pd.DataFrame]:
    """Texts dealt round-robin into `n_shards` tables of near-equal size and length mix."""
    return [texts.iloc[i::n_shards] for i in range(n_shards)]


def selected_texts(texts: dict[str, Any]) -> pd.DataFrame:
    """The texts config['fluency']['texts'] names: the user's files, or the embedded reviews."""
    if texts["source"] == "files":
        if not texts["files"]:
            raise ConfigError("fluency.texts.files", "empty, but source is 'files'", "text files")
        return file_texts(
            texts["files"], texts["text_column"], texts["id_column"], texts["group_columns"]
        )
    keys = ("n_texts", "corpus", "max_words", "seed", "shuffled_twins", "min_words")
    return embedded_texts(**{key: texts[key] for key in keys})


def main(args: argparse.Namespace) -> int:
    """`gpuflow fluency-texts`: write the texts config['fluency']['texts'] names."""
    frame = selected_texts(family_settings("fluency", args.settings)["texts"])
    write_csv(args.out, frame)
    print(f"wrote {len(frame)} texts to {args.out}")
    return 0


def read_texts(path: str | Path) -> pd.DataFrame:
    """A texts CSV as strings, with text_id and text, each text id once."""
    try:
        frame = pd.read_csv(path, keep_default_na=False, dtype=str)
    except (OSError, ValueError, UnicodeDecodeError) as error:
        raise DataError(path, f"cannot read as CSV: {error}") from error
    missing = [c for c in ("text_id", "text") if c not in frame.columns]
    if missing:
        raise DataError(path, f"missing columns {missing}", expected="columns text_id and text")
    check_unique_ids(path, frame["text_id"])
    return frame


def check_unique_ids(path: str | Path, ids: pd.Series) -> None:
    """Each text id of a CSV column once; a repeat names its row and the first."""
    repeated = np.flatnonzero(ids.duplicated().to_numpy())
    if repeated.size:
        text_id = ids.iloc[repeated[0]]
        first = int(np.flatnonzero((ids == text_id).to_numpy())[0])
        raise DataError(
            path,
            f"text id {text_id!r} again (first at row {first + 2})",
            row=int(repeated[0]) + 2,
            expected="each text id once",
        )


def split_main(args: argparse.Namespace) -> int:
    """`gpuflow fluency-split`: deal the texts into one CSV per shard."""
    texts = read_texts(args.texts)
    for path, shard in zip(args.out, deal_into_shards(texts, len(args.out)), strict=True):
        write_csv(path, shard)
        print(f"wrote {len(shard)} texts to {path}")
    return 0
