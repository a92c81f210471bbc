"""Correlation of log-perplexity with toxicity: estimates, seeded bootstrap CIs, binned means."""

from __future__ import annotations

import argparse
import math
import time
import warnings
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from gpuflow.data.numbers import finite_column
from gpuflow.errors import DataError
from gpuflow.fluency.texts import check_unique_ids
from gpuflow.job import write_csv, write_json
from gpuflow.settings.blocks import block_settings

REQUIRED_COLUMNS = ("text_id", "ppl", "n_tokens", "toxicity", "toxicity_scorer")
METHODS = ("pearson", "spearman", "kendall", "partial_pearson", "partial_spearman")
PARTIAL_METHODS = ("partial_pearson", "partial_spearman")
MIN_TEXTS = {"pearson": 3, "spearman": 3, "kendall": 3, "partial_pearson": 4, "partial_spearman": 4}
OVERALL = "all"
MISSING_GROUP = "(missing)"
CORRELATION_COLUMNS = [
    "group_column",
    "group",
    "method",
    "estimate",
    "ci_low",
    "ci_high",
    "p_value",
    "n",
    "n_boot_valid",
    "n_bootstrap",
    "confidence",
    "reason",
]
BINNED_COLUMNS = [
    "bin",
    "logppl_min",
    "logppl_max",
    "ppl_min",
    "ppl_max",
    "n",
    "mean_logppl",
    "mean_toxicity",
    "ci_low",
    "ci_high",
    "n_bootstrap",
    "confidence",
    "reason",
]
# Resample matrices are processed in chunks of at most this many cells (memory stays ~100 MB).
CHUNK_CELLS = 2_000_000
# Up to this many texts the bootstrap Kendall uses matrix products (rows * n^2), above it scipy.
KENDALL_MATMUL_MAX_N = 2500
# Below this share of usable resamples (the others had a constant column) no CI is given.
MIN_VALID_SHARE = 0.5


def load_scores(path: str | Path, group_columns: list[str]) -> pd.DataFrame:
    """Read scores.csv, check its columns and values, and add `log_ppl`."""
    try:
        frame = pd.read_csv(  # labels such as "NA" or "None" are labels: only "" is missing
            path,
            dtype={column: "str" for column in group_columns},
            keep_default_na=False,
            na_values=[""],
        )
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as error:
        raise DataError(path, f"cannot read scores ({error})") from None
    for column in (*REQUIRED_COLUMNS, *group_columns):
        if column not in frame.columns:
            raise DataError(path, f"missing column '{column}'", expected="the merge step's columns")
    if frame.empty:
        raise DataError(path, "no texts")
    check_unique_ids(path, frame["text_id"])  # a text counted twice would weigh twice
    for column in ("ppl", "n_tokens", "toxicity"):
        frame[column] = finite_column(path, frame, column, positive=column != "toxicity")
    for column in group_columns:
        frame[column] = frame[column].fillna(MISSING_GROUP).astype(str)
    frame["log_ppl"] = np.log(frame["ppl"])
    return frame


def _rng(seed: int, key: str) -> np.random.Generator:
    """A generator for one group's bootstrap: the same seed and key give the same draws."""
    return np.random.default_rng(np.random.SeedSequence([seed, zlib.crc32(key.encode())]))


def _resample_chunks(rng: np.random.Generator, n: int, n_boot: int) -> Iterator[np.ndarray]:
    """Index matrices (rows = resamples of n texts with replacement), n_boot rows in all."""
    rows = max(1, CHUNK_CELLS // n)
    for start in range(0, n_boot, rows):
        yield rng.integers(0, n, size=(min(rows, n_boot - start), n))


def _row_counts(codes: np.ndarray, n_codes: int, index: np.ndarray) -> np.ndarray:
    """For each resample (row of index), how often each code occurs: shape (rows, n_codes)."""
    rows = index.shape[0]
    flat = (codes[index] + n_codes * np.arange(rows)[:, None]).ravel()
    return np.bincount(flat, minlength=rows * n_codes).reshape(rows, n_codes).astype(float)


@dataclass(frozen=True)
class Variable:
    """A variable's values over the texts, with each one's code among its sorted distinct values."""

    values: np.ndarray
    codes: np.ndarray
    n_distinct: int

    @classmethod
    def of(cls, values: np.ndarray) -> Variable:
        """Code the values by rank among the distinct ones."""
        values = np.asarray(values, dtype=float)
        codes = np.unique(values, return_inverse=True)[1].ravel()
        return cls(values, codes, int(codes.max()) + 1 if len(codes) else 0)

    def counts(self, index: np.ndarray) -> np.ndarray:
        """Copies of each distinct value in each resample: shape (rows, n_distinct)."""
        return _row_counts(self.codes, self.n_distinct, index)

    def ranks(self, counts: np.ndarray) -> np.ndarray:
        """Average rank (1-based, ties averaged) of each text's value within each resample."""
        upto = counts.cumsum(axis=1)
        return (upto - (counts - 1) / 2)[:, self.codes]


def weighted_pearson(
    weights: np.ndarray, a: np.ndarray, b: np.ndarray, constant: np.ndarray
) -> np.ndarray:
    """Pearson r of each resample given as counts over the texts (rows of `weights`)."""
    total = weights.sum(axis=1)

    def mean(v: np.ndarray) -> np.ndarray:
        sums = weights @ v if v.ndim == 1 else np.einsum("ij,ij->i", weights, v)
        return sums / total

    a = a - a.mean() if a.ndim == 1 else a
    b = b - b.mean() if b.ndim == 1 else b
    mean_a, mean_b = mean(a), mean(b)
    covariance = mean(a * b) - mean_a * mean_b
    variances = (mean(a * a) - mean_a**2) * (mean(b * b) - mean_b**2)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = covariance / np.sqrt(variances)
    return np.where(constant | ~(variances > 0), np.nan, np.clip(r, -1.0, 1.0))


def partial_from(
    r_xy: np.ndarray, r_xz: np.ndarray, r_yz: np.ndarray, z_constant: np.ndarray
) -> np.ndarray:
    """Partial r of x and y given z from the three correlations."""
    r_xz = np.where(z_constant, 0.0, r_xz)
    r_yz = np.where(z_constant, 0.0, r_yz)
    denominator = (1 - r_xz**2) * (1 - r_yz**2)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = (r_xy - r_xz * r_yz) / np.sqrt(denominator)
    return np.where(denominator < 1e-12, np.nan, np.clip(r, -1.0, 1.0))


def kendall_signs(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """A[i, j] = sign(x_i - x_j) * sign(y_i - y_j): +1 concordant, -1 discordant, 0 tied."""
    return np.sign(x[:, None] - x[None, :]) * np.sign(y[:, None] - y[None, :])


def kendall_from_counts(
    weights: np.ndarray, signs: np.ndarray, x_counts: np.ndarray, y_counts: np.ndarray
) -> np.ndarray:
    """Kendall tau-b of each resample (counts w over the texts), exactly, by matrix products."""
    twice_s = ((weights @ signs) * weights).sum(axis=1)
    total = weights.sum(axis=1) ** 2
    denominator = (total - (x_counts**2).sum(axis=1)) * (total - (y_counts**2).sum(axis=1))
    with np.errstate(divide="ignore", invalid="ignore"):
        tau = twice_s / np.sqrt(denominator)
    return np.where(denominator > 0, np.clip(tau, -1.0, 1.0), np.nan)


def kendall_scipy(x: np.ndarray, y: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Kendall tau-b per resample with scipy, one call each (n log n: for large n)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.array([stats.kendalltau(x[row], y[row]).statistic for row in index], float)


def resample_statistics(
    x: Variable,
    y: Variable,
    z: Variable,
    index: np.ndarray,
    methods: list[str],
    signs: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Each method on each resample (row of `index`, text positions drawn with replacement)."""
    n = len(x.values)
    weights = _row_counts(np.arange(n), n, index)
    counts = {name: v.counts(index) for name, v in (("x", x), ("y", y), ("z", z))}
    constant = {name: (c > 0).sum(axis=1) < 2 for name, c in counts.items()}
    out: dict[str, np.ndarray] = {}

    def correlations(a: np.ndarray, b: np.ndarray, c: np.ndarray, partial: bool) -> tuple:
        r_ab = weighted_pearson(weights, a, b, constant["x"] | constant["y"])
        if not partial:
            return r_ab, None
        r_ac = weighted_pearson(weights, a, c, constant["x"] | constant["z"])
        r_bc = weighted_pearson(weights, b, c, constant["y"] | constant["z"])
        return r_ab, partial_from(r_ab, r_ac, r_bc, constant["z"])

    if "pearson" in methods or "partial_pearson" in methods:
        plain, partial = correlations(x.values, y.values, z.values, "partial_pearson" in methods)
        out["pearson"], out["partial_pearson"] = plain, partial
    if "spearman" in methods or "partial_spearman" in methods:
        ranks = {name: v.ranks(counts[name]) for name, v in (("x", x), ("y", y), ("z", z))}
        plain, partial = correlations(
            ranks["x"], ranks["y"], ranks["z"], "partial_spearman" in methods
        )
        out["spearman"], out["partial_spearman"] = plain, partial
    if "kendall" in methods:
        if signs is not None:
            out["kendall"] = kendall_from_counts(weights, signs, counts["x"], counts["y"])
        else:
            out["kendall"] = kendall_scipy(x.values, y.values, index)
    return {method: out[method] for method in methods}


def bootstrap(
    x: np.ndarray,
    y: np.ndarray,
    z: np.ndarray,
    methods: list[str],
    settings: Mapping[str, Any],
    key: str,
) -> dict[str, np.ndarray]:
    """Bootstrap distributions (n_bootstrap values, NaN where degenerate) of each method."""
    rng = _rng(settings["seed"], key)
    variables = Variable.of(x), Variable.of(y), Variable.of(z)
    use_signs = "kendall" in methods and len(x) <= KENDALL_MATMUL_MAX_N
    signs = kendall_signs(x, y) if use_signs else None
    parts: dict[str, list[np.ndarray]] = {method: [] for method in methods}
    for index in _resample_chunks(rng, len(x), settings["n_bootstrap"]):
        for method, values in resample_statistics(*variables, index, methods, signs).items():
            parts[method].append(values)
    return {method: np.concatenate(chunks) for method, chunks in parts.items()}


def _p_partial(r: float, n: int) -> float:
    """Two-sided p-value of a partial correlation with one covariate (t-test, n - 3 df)."""
    df = n - 3
    if not math.isfinite(r) or df < 1:
        return math.nan
    if abs(r) >= 1:
        return 0.0
    t = r * math.sqrt(df / (1 - r * r))
    return float(2 * stats.t.sf(abs(t), df))


def point_estimates(log_ppl: np.ndarray, toxicity: np.ndarray, n_tokens: np.ndarray) -> dict:
    """Estimate and p-value of each method on the given texts: {method: (estimate, p)}."""
    x, y, z = (np.asarray(v, dtype=float) for v in (log_ppl, toxicity, np.log(n_tokens)))
    tests = {"pearson": stats.pearsonr, "spearman": stats.spearmanr, "kendall": stats.kendalltau}
    result: dict[str, tuple[float, float]] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for method, test in tests.items():
            found = test(x, y)
            result[method] = (float(found.statistic), float(found.pvalue))
    n = len(x)
    identity = np.arange(n)[None, :]
    variables = Variable.of(x), Variable.of(y), Variable.of(z)
    partials = resample_statistics(*variables, identity, list(PARTIAL_METHODS))
    for method, values in partials.items():
        result[method] = (float(values[0]), _p_partial(float(values[0]), n))
    return result


def _constant_reason(x: np.ndarray, y: np.ndarray) -> str:
    constant = [name for name, v in (("log-perplexity", x), ("toxicity", y)) if np.ptp(v) == 0]
    return " and ".join(constant) + (" is" if len(constant) == 1 else " are") + " constant"


def correlate(frame: pd.DataFrame, settings: Mapping[str, Any], key: str) -> list[dict[str, Any]]:
    """One row per method (estimate, CI, p-value, n, reason) for the texts in `frame`."""
    x = frame["log_ppl"].to_numpy(dtype=float)
    y = frame["toxicity"].to_numpy(dtype=float)
    z = np.log(frame["n_tokens"].to_numpy(dtype=float))
    n = len(x)
    base = {"n": n, "n_bootstrap": settings["n_bootstrap"], "confidence": settings["confidence"]}
    rows: dict[str, dict[str, Any]] = {}
    usable = []
    for method in METHODS:
        row = {"method": method, "estimate": math.nan, "ci_low": math.nan, "ci_high": math.nan}
        row |= {"p_value": math.nan, "n_boot_valid": 0, "reason": "", **base}
        if n < MIN_TEXTS[method]:
            row["reason"] = f"fewer than {MIN_TEXTS[method]} texts (n={n})"
        elif np.ptp(x) == 0 or np.ptp(y) == 0:
            row["reason"] = _constant_reason(x, y)
        else:
            usable.append(method)
        rows[method] = row
    if usable:
        estimates = point_estimates(x, y, frame["n_tokens"].to_numpy(dtype=float))
        draws = bootstrap(x, y, z, usable, settings, key)
        alpha = 1 - settings["confidence"]
        for method in usable:
            row = rows[method]
            row["estimate"], row["p_value"] = estimates[method]
            values = draws[method][np.isfinite(draws[method])]
            row["n_boot_valid"] = len(values)
            if not math.isfinite(row["estimate"]):
                row["reason"] = "undefined (length explains log-perplexity or toxicity fully)"
            elif len(values) < MIN_VALID_SHARE * settings["n_bootstrap"]:
                row["reason"] = (
                    f"no CI: only {len(values)} of {settings['n_bootstrap']} resamples had "
                    "varying values"
                )
            else:
                low, high = np.percentile(values, [100 * alpha / 2, 100 * (1 - alpha / 2)])
                row["ci_low"], row["ci_high"] = float(low), float(high)
                if len(values) < settings["n_bootstrap"]:
                    row["reason"] = (
                        f"CI from {len(values)} of {settings['n_bootstrap']} resamples "
                        "(the others had a constant column)"
                    )
    return [rows[method] for method in METHODS]


def correlation_table(
    frame: pd.DataFrame, group_columns: list[str], settings: Mapping[str, Any]
) -> pd.DataFrame:
    """The tidy correlations table: overall, then per value of each group column."""
    records = [
        {"group_column": OVERALL, "group": OVERALL, **row}
        for row in correlate(frame, settings, OVERALL)
    ]
    for column in group_columns:
        for value in sorted(frame[column].unique()):
            subset = frame[frame[column] == value]
            for row in correlate(subset, settings, f"{column}={value}"):
                records.append({"group_column": column, "group": value, **row})
    return pd.DataFrame.from_records(records, columns=CORRELATION_COLUMNS)


def binned_means(frame: pd.DataFrame, settings: Mapping[str, Any]) -> pd.DataFrame:
    """Mean toxicity (with a bootstrap CI) in quantile bins of log-perplexity."""
    log_ppl = frame["log_ppl"]
    if log_ppl.nunique() < 2:
        codes = np.zeros(len(frame), dtype=int)
    else:
        bins = min(settings["n_bins"], len(frame))
        codes = pd.qcut(log_ppl, q=bins, labels=False, duplicates="drop").to_numpy()
    alpha = 1 - settings["confidence"]
    records = []
    for number, code in enumerate(np.unique(codes), start=1):
        members = frame[codes == code]
        toxicity = members["toxicity"].to_numpy(dtype=float)
        row = {
            "bin": number,
            "logppl_min": float(members["log_ppl"].min()),
            "logppl_max": float(members["log_ppl"].max()),
            "ppl_min": float(members["ppl"].min()),
            "ppl_max": float(members["ppl"].max()),
            "n": len(members),
            "mean_logppl": float(members["log_ppl"].mean()),
            "mean_toxicity": float(toxicity.mean()),
            "ci_low": math.nan,
            "ci_high": math.nan,
            "n_bootstrap": settings["n_bootstrap"],
            "confidence": settings["confidence"],
            "reason": "",
        }
        if len(members) < 2:
            row["reason"] = "no CI: fewer than 2 texts in the bin"
        else:
            rng = _rng(settings["seed"], f"bin={number}")
            chunks = _resample_chunks(rng, len(toxicity), settings["n_bootstrap"])
            means = np.concatenate([toxicity[index].mean(axis=1) for index in chunks])
            low, high = np.percentile(means, [100 * alpha / 2, 100 * (1 - alpha / 2)])
            row["ci_low"], row["ci_high"] = float(low), float(high)
        records.append(row)
    return pd.DataFrame.from_records(records, columns=BINNED_COLUMNS)


def _clean(value: Any) -> Any:
    """JSON-safe scalar: NaN becomes null, numpy scalars become Python ones."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def correlations_json(
    table: pd.DataFrame, settings: Mapping[str, Any], frame: pd.DataFrame, group_columns: list[str]
) -> dict[str, Any]:
    """The correlations table, nested: overall and by_group -> column -> value -> method."""

    def methods(rows: pd.DataFrame) -> dict[str, Any]:
        fields = ["estimate", "ci_low", "ci_high", "p_value", "n", "n_boot_valid", "reason"]
        return {
            row["method"]: {field: _clean(row[field]) for field in fields}
            for row in rows.to_dict("records")
        }

    overall = table[table["group_column"] == OVERALL]
    by_group: dict[str, dict[str, Any]] = {}
    for column in group_columns:
        rows = table[table["group_column"] == column]
        by_group[column] = {
            value: methods(rows[rows["group"] == value]) for value in rows["group"].unique()
        }
    return {
        "x": "log perplexity (natural log of ppl, nats/token)",
        "y": "toxicity",
        "toxicity_scorer": " + ".join(sorted(frame["toxicity_scorer"].astype(str).unique())),
        "partial_covariate": "log(n_tokens)",
        "ci": f"percentile bootstrap over texts, {settings['n_bootstrap']} resamples",
        "settings": dict(settings),
        "n_texts": len(frame),
        "overall": methods(overall),
        "by_group": by_group,
    }


def main(args: argparse.Namespace) -> int:
    """`gpuflow fluency-stats`: correlations.csv, correlations.json and binned.csv."""
    started = time.perf_counter()
    settings = block_settings("fluency", ("stats",), args.settings)
    group_columns = list(args.group_columns)
    frame = load_scores(args.scores, group_columns)
    print(f"{len(frame)} texts from {args.scores}; settings {dict(settings)}", flush=True)
    table = correlation_table(frame, group_columns, settings)
    binned = binned_means(frame, settings)
    write_csv(args.out_correlations, table)
    write_json(args.out_json, correlations_json(table, settings, frame, group_columns))
    write_csv(args.out_binned, binned)
    overall = table[table["group_column"] == OVERALL]
    for row in overall.to_dict("records"):
        print(
            f"{row['method']:>17}: {row['estimate']:+.3f} "
            f"[{row['ci_low']:+.3f}, {row['ci_high']:+.3f}] p={row['p_value']:.3g} {row['reason']}"
        )
    print(f"{len(binned)} bins; done in {time.perf_counter() - started:.1f} s", flush=True)
    return 0
