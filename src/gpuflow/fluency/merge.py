"""Join texts, per-shard perplexities and toxicity scores into one table, and summarise."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from gpuflow.data.numbers import finite_column
from gpuflow.errors import DataError
from gpuflow.fluency.texts import read_texts
from gpuflow.job import write_csv, write_json

# The columns of each scorer's shards, and which of them hold numbers.
PERPLEXITY_COLUMNS = ("text_id", "nll_sum", "n_tokens", "ppl")
TOXICITY_COLUMNS = ("text_id", "toxicity", "toxicity_scorer")
NUMBERS = {"nll_sum", "n_tokens", "ppl", "toxicity"}


def read_shard(path: str, what: str, columns: Sequence[str]) -> pd.DataFrame:
    """One shard CSV with its `columns`; any problem is an error naming the file (and row)."""
    try:
        frame = pd.read_csv(path, dtype={"text_id": str}, keep_default_na=False)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as error:
        raise DataError(path, f"cannot read the {what} shard ({error})") from None
    missing = [column for column in columns if column not in frame.columns]
    if missing:
        raise DataError(
            path, f"no {missing} column(s) in the {what} shard", expected=f"columns {list(columns)}"
        )
    for column in NUMBERS.intersection(columns):
        finite_column(path, frame, column)
    return frame


def read_shards(paths: list[str], what: str, columns: Sequence[str]) -> pd.DataFrame:
    """Concatenate shard CSVs (see read_shard); a text id that appears twice is an error."""
    frames = [read_shard(path, what, columns).assign(_file=path) for path in paths]
    table = pd.concat(frames, ignore_index=True)
    doubled = table[table["text_id"].duplicated(keep=False)]
    if not doubled.empty:
        first = doubled.iloc[0]
        raise DataError(first["_file"], f"text id {first['text_id']!r} scored twice for {what}")
    return table.drop(columns="_file")


def join_scores(
    texts: pd.DataFrame, perplexity: pd.DataFrame, toxicity: pd.DataFrame, texts_path: str
) -> pd.DataFrame:
    """Texts with their perplexity and toxicity columns; every text must have both."""
    for what, table in (("perplexity", perplexity), ("toxicity", toxicity)):
        missing = sorted(set(texts["text_id"]) - set(table["text_id"]))
        extra = sorted(set(table["text_id"]) - set(texts["text_id"]))
        if missing or extra:
            problem = f"{len(missing)} texts have no {what} score (first: {missing[:3]})"
            if extra:
                problem = f"{len(extra)} {what} scores match no text (first: {extra[:3]})"
            raise DataError(texts_path, problem)
    scored = texts.merge(perplexity, on="text_id", validate="one_to_one")
    return scored.merge(toxicity, on="text_id", validate="one_to_one")


def corpus_perplexity(nll_sums: Sequence[float], n_tokens: Sequence[int]) -> float:
    """exp(total NLL / total tokens): the perplexity of all texts as one corpus."""
    total_tokens = int(np.sum(np.asarray(n_tokens, dtype=np.int64)))
    if total_tokens == 0:
        return float("nan")
    return math.exp(float(np.sum(np.asarray(nll_sums, dtype=np.float64))) / total_tokens)


def _totals(scores: pd.DataFrame) -> dict[str, Any]:
    """Texts, tokens and corpus perplexity of a set of scored texts."""
    return {
        "n_texts": len(scores),
        "n_tokens": int(scores["n_tokens"].sum()),
        "corpus_ppl": corpus_perplexity(scores["nll_sum"], scores["n_tokens"]),
    }


def summarise(scores: pd.DataFrame, model: str, group_columns: list[str]) -> dict[str, Any]:
    """Counts and perplexities overall and per value of each group column."""
    return {
        "model": model,
        "toxicity_scorer": ", ".join(sorted(scores["toxicity_scorer"].unique())),
        **_totals(scores),
        "mean_text_ppl": float(scores["ppl"].mean()),
        "median_text_ppl": float(scores["ppl"].median()),
        "by_group": {
            column: {str(value): _totals(rows) for value, rows in scores.groupby(column)}
            for column in group_columns
        },
    }


def main(args: argparse.Namespace) -> int:
    """`gpuflow fluency-merge`: one scores table and the perplexity summary."""
    texts = read_texts(args.texts)
    scores = join_scores(
        texts,
        read_shards(args.perplexity, "perplexity", PERPLEXITY_COLUMNS),
        read_shards(args.toxicity, "toxicity", TOXICITY_COLUMNS),
        args.texts,
    )
    summary = summarise(scores, args.model_name, args.group_columns)
    write_csv(args.out, scores)
    write_json(args.out_summary, summary)
    print(f"merged {len(scores)} texts; corpus perplexity {summary['corpus_ppl']:.2f}")
    return 0
