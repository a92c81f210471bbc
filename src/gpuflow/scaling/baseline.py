"""`gpuflow scaling-baseline`: a CPU-only TF-IDF classifier on the same splits."""

from __future__ import annotations

import argparse
import time
from typing import Any

from sklearn.decomposition import TruncatedSVD
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline, make_pipeline
from threadpoolctl import threadpool_limits

from gpuflow.job import run_record, write_json
from gpuflow.scaling.tokens import read_split
from gpuflow.settings.blocks import family_settings


def build_pipeline(settings: dict[str, Any]) -> Pipeline:
    """The scikit-learn pipeline the settings describe."""
    features = TfidfVectorizer(
        max_features=settings["max_features"],
        ngram_range=(1, settings["ngram_max"]),
        min_df=settings["min_df"],
        sublinear_tf=True,
    )
    if settings["classifier"] == "logistic_regression":
        return make_pipeline(features, LogisticRegression(C=settings["C"], max_iter=1000))
    return make_pipeline(
        features,
        TruncatedSVD(settings["svd_components"], random_state=settings["seed"]),
        HistGradientBoostingClassifier(random_state=settings["seed"]),
    )


def main(args: argparse.Namespace) -> None:
    """Fit on the training split, score the validation split, write the record."""
    settings = family_settings("scaling", args.settings)["baseline"]
    train, val = read_split(args.train), read_split(args.val)
    pipeline = build_pipeline(settings)
    with threadpool_limits(args.threads):
        start = time.perf_counter()
        pipeline.fit(train["text"], train["label"])
        fit_seconds = time.perf_counter() - start
        accuracy = float((pipeline.predict(val["text"]) == val["label"]).mean())
    record = {
        "configuration": args.name,
        "method": f"tfidf+{settings['classifier']}",
        "threads": args.threads,
        "n_train": len(train),
        "n_val": len(val),
        "fit_seconds": fit_seconds,
        "val_accuracy": accuracy,
        "settings": settings,
        "run_record": run_record(),
    }
    write_json(args.out, record)
    print(f"{record['method']}: validation accuracy {accuracy:.4f}, fit {fit_seconds:.1f} s")
