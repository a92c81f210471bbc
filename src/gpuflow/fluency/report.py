"""The fluency-toxicity summary in markdown: every number is read from the tables and the JSON."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from gpuflow.errors import DataError
from gpuflow.fluency.stats import BINNED_COLUMNS, CORRELATION_COLUMNS, OVERALL
from gpuflow.job import markdown_table, telemetry_section, write_text

SUMMARY_KEYS = (
    "model",
    "toxicity_scorer",
    "n_texts",
    "n_tokens",
    "corpus_ppl",
    "mean_text_ppl",
    "median_text_ppl",
    "by_group",
)
METHOD_NAMES = {
    "pearson": "Pearson r",
    "spearman": "Spearman ρ",
    "kendall": "Kendall τ-b",
    "partial_pearson": "partial Pearson r (given log length)",
    "partial_spearman": "partial Spearman ρ (given length rank)",
}
PLAIN = ("pearson", "spearman", "kendall")
PARTIAL = ("partial_pearson", "partial_spearman")
# Strength words for |r| (Pearson, Spearman and partials): below each bound, its word.
STRENGTH = ((0.1, "negligible"), (0.3, "weak"), (0.5, "moderate"), (math.inf, "strong"))


def is_proxy(name: str) -> bool:
    """Whether a scorer is the embedded offensive-language classifier (a toxicity proxy)."""
    return "profanity" in name.lower()


def describe_scorer(name: str) -> str:
    """The scorer's name, marking the embedded offensive-language classifier as a proxy."""
    if is_proxy(name) and "proxy" not in name.lower():
        return f"{name} (proxy for toxicity: an offensive-language classifier)"
    return name


def fmt(value: Any, digits: int = 3, signed: bool = True) -> str:
    """A table number as printed everywhere in the report; NaN/None as 'n/a'."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def fmt_p(value: float) -> str:
    """A p-value with two significant digits."""
    if not math.isfinite(value):
        return "n/a"
    return "< 1e-300" if value == 0 else f"{value:.2g}"


def fmt_ci(low: float, high: float, signed: bool = True) -> str:
    """'[low, high]', or 'n/a' when there is no interval."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return "n/a"
    return f"[{fmt(low, signed=signed)}, {fmt(high, signed=signed)}]"


def strength(estimate: float) -> str:
    """'negligible' / 'weak' / 'moderate' / 'strong' from |estimate|."""
    return next(word for bound, word in STRENGTH if abs(estimate) < bound)


def read_summary(path: str | Path) -> dict[str, Any]:
    """perplexity_summary.json from the merge step; DataError names a missing key."""
    try:
        summary = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as error:
        raise DataError(path, f"cannot read the perplexity summary ({error})") from None
    if not isinstance(summary, dict):
        raise DataError(path, "not a JSON object")
    for key in SUMMARY_KEYS:
        if key not in summary:
            raise DataError(path, f"missing key '{key}'", expected="the merge step's summary")
    return summary


def read_table(path: str | Path, columns: list[str], what: str = "table") -> pd.DataFrame:
    """A CSV written by fluency-stats; DataError names a missing column."""
    try:
        table = pd.read_csv(
            path,
            keep_default_na=False,
            na_values=[""],
            dtype={"group": str, "group_column": str, "reason": str},
        )
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as error:
        raise DataError(path, f"cannot read {what} ({error})") from None
    for column in columns:
        if column not in table.columns:
            raise DataError(path, f"missing column '{column}'", expected="fluency-stats columns")
    table["reason"] = table["reason"].fillna("").astype(str)
    return table


def correlation_rows(table: pd.DataFrame, methods: tuple[str, ...]) -> list[list[str]]:
    """Markdown rows (group column, group, method, estimate, CI, p, n, note) for `methods`."""
    return [
        [
            str(row["group_column"]),
            str(row["group"]),
            METHOD_NAMES[row["method"]],
            fmt(row["estimate"]),
            fmt_ci(row["ci_low"], row["ci_high"]),
            fmt_p(row["p_value"]),
            str(int(row["n"])),
            row["reason"],
        ]
        for row in table[table["method"].isin(methods)].to_dict("records")
    ]


def binned_rows(binned: pd.DataFrame) -> list[list[str]]:
    """Markdown rows of the binned means table."""
    return [
        [
            str(int(row["bin"])),
            f"{fmt(row['logppl_min'], signed=False)} to {fmt(row['logppl_max'], signed=False)}",
            f"{fmt(row['ppl_min'], 1, False)} to {fmt(row['ppl_max'], 1, False)}",
            str(int(row["n"])),
            fmt(row["mean_logppl"], signed=False),
            fmt(row["mean_toxicity"], signed=False),
            fmt_ci(row["ci_low"], row["ci_high"], signed=False),
            row["reason"],
        ]
        for row in binned.to_dict("records")
    ]


def reading(row: dict[str, Any], confidence: float) -> str:
    """One sentence on one correlation, derived from its estimate and CI."""
    name = METHOD_NAMES[row["method"]]
    estimate = row["estimate"]
    if not math.isfinite(estimate):
        return f"{name}: not available ({row['reason'] or 'undefined'})."
    sign = "positive" if estimate > 0 else "negative" if estimate < 0 else "zero"
    strength_word = "" if row["method"] == "kendall" else f"{strength(estimate)} "
    words = f"a {strength_word}{sign} association"
    low, high = row["ci_low"], row["ci_high"]
    if not (math.isfinite(low) and math.isfinite(high)):
        ci = f"no CI ({row['reason']})"
    elif low > 0 or high < 0:
        ci = f"its {confidence:.0%} CI {fmt_ci(low, high)} excludes zero"
    else:
        ci = (
            f"its {confidence:.0%} CI {fmt_ci(low, high)} includes zero, so these texts do "
            "not rule out no association"
        )
    return f"{name} = {fmt(estimate)}: {words}; {ci}."


def direction(row: dict[str, Any]) -> str:
    """What the sign of a log-perplexity/toxicity correlation means, hedged by its CI."""
    estimate, low, high = row["estimate"], row["ci_low"], row["ci_high"]
    if not math.isfinite(estimate) or estimate == 0:
        return "no direction can be read"
    if estimate > 0:
        words = "less fluent texts (higher perplexity) tend to get higher toxicity scores"
    else:
        words = "more fluent texts (lower perplexity) tend to get higher toxicity scores"
    if math.isfinite(low) and math.isfinite(high) and (low > 0 or high < 0):
        return words
    return f"the sign alone says {words}, but the CI does not exclude zero"


def build_report(summary: dict[str, Any], table: pd.DataFrame, binned: pd.DataFrame) -> str:
    """The markdown summary."""
    overall = {
        row["method"]: row for row in table[table["group_column"] == OVERALL].to_dict("records")
    }
    confidence = float(table["confidence"].iloc[0])
    n_bootstrap = int(table["n_bootstrap"].iloc[0])
    corpus, mean_ppl = summary["corpus_ppl"], summary["mean_text_ppl"]
    lines = [
        "# Fluency and toxicity: summary",
        "",
        f"- Reference language model: `{summary['model']}`",
        f"- Toxicity scorer: {describe_scorer(str(summary['toxicity_scorer']))}",
        f"- Texts: {summary['n_texts']}; tokens scored: {summary['n_tokens']}",
        "",
        "## Perplexity",
        "",
        markdown_table(
            ["measure", "value"],
            [
                ["corpus perplexity: exp(total NLL / total tokens)", fmt(corpus, 2, False)],
                ["mean of per-text perplexities", fmt(mean_ppl, 2, False)],
                ["median of per-text perplexities", fmt(summary["median_text_ppl"], 2, False)],
            ],
        ),
        "",
        "Corpus perplexity weights every token equally, so long texts count most; the mean of "
        "per-text perplexities weights every text equally, and since exp is convex it is pulled "
        "up by texts with a high loss per token (often short ones). "
        + _ppl_comparison(corpus, mean_ppl),
        "",
    ]
    group_rows = [
        [
            column,
            str(value),
            str(entry["n_texts"]),
            str(entry["n_tokens"]),
            fmt(entry["corpus_ppl"], 2, False),
        ]
        for column, values in summary["by_group"].items()
        for value, entry in values.items()
    ]
    if group_rows:
        lines += [
            "Per group:",
            "",
            markdown_table(
                ["group column", "group", "texts", "tokens", "corpus perplexity"], group_rows
            ),
            "",
        ]
    header = ["group column", "group", "method", "estimate", "CI", "p", "n", "note"]
    lines += [
        "## Correlation of log-perplexity with toxicity",
        "",
        f"Log-perplexity is the natural log of each text's perplexity (nats/token). Intervals: "
        f"{confidence:.0%} percentile bootstrap over texts, {n_bootstrap} resamples; p-values "
        "from scipy.",
        "",
        markdown_table(header, correlation_rows(table, PLAIN)),
        "",
        "## Partial correlation, controlling for length",
        "",
        "Residuals of log-perplexity and toxicity after a linear regression on log(n_tokens) "
        "(Pearson), or of their ranks on the rank of n_tokens (Spearman); p-values from a "
        "t-test with n − 3 degrees of freedom.",
        "",
        markdown_table(header, correlation_rows(table, PARTIAL)),
        "",
        "## Mean toxicity in quantile bins of log-perplexity",
        "",
        markdown_table(
            [
                "bin",
                "log-ppl range",
                "ppl range",
                "n",
                "mean log-ppl",
                "mean toxicity",
                f"{confidence:.0%} CI",
                "note",
            ],
            binned_rows(binned),
        ),
        "",
        "## Reading",
        "",
        *_reading_lines(overall, table, binned, confidence),
        "",
    ]
    return "\n".join(lines)


def _ppl_comparison(corpus: float, mean_ppl: float) -> str:
    if not (math.isfinite(corpus) and math.isfinite(mean_ppl)) or corpus <= 0:
        return ""
    ratio = mean_ppl / corpus
    relation = "above" if mean_ppl > corpus else "below" if mean_ppl < corpus else "equal to"
    return f"Here the mean per-text perplexity is {ratio:.2f} times the corpus one ({relation} it)."


def _reading_lines(
    overall: dict[str, dict[str, Any]],
    table: pd.DataFrame,
    binned: pd.DataFrame,
    confidence: float,
) -> list[str]:
    bounds = [f"< {bound} {word}" for bound, word in STRENGTH if math.isfinite(bound)]
    words = ", ".join(bounds) + f", otherwise {STRENGTH[-1][1]}"
    lines = [f"All texts (strength words for |r|: {words}; none for Kendall's τ):", ""]
    lines += [f"- {reading(overall[method], confidence)}" for method in (*PLAIN, *PARTIAL)]
    pearson = overall["pearson"]["estimate"]
    lines += ["", f"Direction (Pearson r): {direction(overall['pearson'])}."]
    partial = overall["partial_pearson"]["estimate"]
    if math.isfinite(pearson) and math.isfinite(partial):
        lines.append(
            f"Controlling for length moves the Pearson r from {fmt(pearson)} to {fmt(partial)}."
        )
    groups = table[(table["group_column"] != OVERALL) & (table["method"] == "spearman")]
    if len(groups):
        lines += ["", "Per group (Spearman ρ):", ""]
        lines += [
            f"- {row['group_column']} = {row['group']}: {reading(row, confidence)}"
            for row in groups.to_dict("records")
        ]
    if len(binned) >= 2:
        first, last = binned.iloc[0], binned.iloc[-1]
        means = binned["mean_toxicity"].to_numpy(float)
        rises = int((means[1:] > means[:-1]).sum())
        lines += [
            "",
            f"Binned means: mean toxicity is {fmt(first['mean_toxicity'], signed=False)} in the "
            f"lowest-perplexity bin and {fmt(last['mean_toxicity'], signed=False)} in the highest; "
            f"it rises in {rises} of the {len(binned) - 1} steps between adjacent bins.",
        ]
    return lines


def main(args: argparse.Namespace) -> int:
    """`gpuflow fluency-report`: summary.md from the perplexity summary and the stats tables."""
    summary = read_summary(args.summary)
    table = read_table(args.correlations, CORRELATION_COLUMNS)
    binned = read_table(args.binned, BINNED_COLUMNS)
    if table.empty:
        raise DataError(args.correlations, "no rows", expected="fluency-stats output")
    write_text(args.out, build_report(summary, table, binned) + telemetry_section(args.out))
    print(f"wrote {args.out}", flush=True)
    return 0
