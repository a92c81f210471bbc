"""`gpuflow fluency-report` and `fluency-figures`: every number shown comes from the tables."""

from __future__ import annotations

import argparse
import json
import re
import struct
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpuflow.errors import DataError
from gpuflow.fluency import figures, report
from gpuflow.fluency.stats import binned_means, load_scores
from gpuflow.settings.blocks import block_settings
from tests.test_fluency_stats import correlated, make_scores, run_stats

GROUPS = ["condition", "source"]


def fake_summary(path: Path, frame: pd.DataFrame, **override: object) -> Path:
    """A perplexity_summary.json as the merge step writes it, for the texts in `frame`."""

    def entry(part: pd.DataFrame) -> dict[str, float]:
        nll, tokens = float(part["nll_sum"].sum()), int(part["n_tokens"].sum())
        return {"n_texts": len(part), "n_tokens": tokens, "corpus_ppl": float(np.exp(nll / tokens))}

    summary = {
        "model": "results/fluency/lm",
        "toxicity_scorer": frame["toxicity_scorer"].iloc[0],
        **entry(frame),
        "mean_text_ppl": float(frame["ppl"].mean()),
        "median_text_ppl": float(frame["ppl"].median()),
        "by_group": {
            column: {str(value): entry(part) for value, part in frame.groupby(column)}
            for column in GROUPS
        },
        **override,
    }
    path.write_text(json.dumps(summary), encoding="utf-8")
    return path


def grouped_scores(n: int, rho: float, seed: int) -> pd.DataFrame:
    log_ppl, toxicity = correlated(n, rho, seed)
    rng = np.random.default_rng(seed)
    return make_scores(
        log_ppl,
        toxicity,
        rng.integers(5, 300, n),
        condition=np.array(["original", "shuffled"] * (n // 2)),
        source=rng.choice(["imdb", "rotten_tomatoes"], n),
    )


def make_report(tmp_path: Path, frame: pd.DataFrame, **summary: object) -> tuple[str, ...]:
    """Run fluency-stats then fluency-report; return (markdown, correlations, binned, summary)."""
    run_stats(tmp_path, frame, GROUPS, n_bootstrap=200)
    summary_path = fake_summary(tmp_path / "summary.json", frame, **summary)
    out = tmp_path / "summary.md"
    args = argparse.Namespace(
        summary=str(summary_path),
        correlations=str(tmp_path / "stats" / "correlations.csv"),
        binned=str(tmp_path / "stats" / "binned.csv"),
        out=str(out),
    )
    assert report.main(args) == 0
    return out.read_text(encoding="utf-8"), args.correlations, args.binned, str(summary_path)


def numbers_in(value: object) -> list[float]:
    """Every number inside a JSON-like value."""
    if isinstance(value, dict):
        return [n for item in value.values() for n in numbers_in(item)]
    if isinstance(value, bool) or not isinstance(value, int | float):
        return []
    return [float(value)]


def shown_as(token: str, value: float) -> bool:
    """Whether `value` printed at the precision of `token` reads as `token`."""
    if "e" in token:
        return abs(float(token) - value) <= 0.05 * abs(float(token))
    decimals = len(token.split(".")[1]) if "." in token else 0
    return abs(float(token) - value) <= 0.5 * 10**-decimals + 1e-12


def test_every_number_in_the_report_tables_is_a_number_of_the_tables_or_json(tmp_path):
    frame = grouped_scores(300, 0.4, seed=20)
    markdown, correlations, binned, summary = make_report(tmp_path, frame)
    table = pd.read_csv(correlations)
    allowed = [
        *table.select_dtypes("number").to_numpy().ravel(),
        *pd.read_csv(binned).select_dtypes("number").to_numpy().ravel(),
        *numbers_in(json.loads(Path(summary).read_text())),
        100 * table["confidence"].iloc[0],
    ]
    allowed = [float(v) for v in allowed if np.isfinite(v)]
    table_lines = [line for line in markdown.splitlines() if line.startswith("|")]
    assert len(table_lines) > 40
    for line in table_lines:
        for token in re.findall(r"[+-]?\d+(?:\.\d+)?(?:e[+-]?\d+)?", line):
            assert any(shown_as(token, value) for value in allowed), (token, line)


def test_each_correlation_row_appears_with_its_estimate_interval_and_p_value(tmp_path):
    markdown, correlations, _, _ = make_report(tmp_path, grouped_scores(200, 0.5, seed=21))
    lines = markdown.splitlines()
    for row in pd.read_csv(correlations).to_dict("records"):
        start = f"| {row['group_column']} | {row['group']} | {report.METHOD_NAMES[row['method']]} |"
        (line,) = [line for line in lines if line.startswith(start)]
        assert f"{row['estimate']:+.3f}" in line
        assert f"[{row['ci_low']:+.3f}, {row['ci_high']:+.3f}]" in line
        assert f"{row['p_value']:.2g}" in line
        assert f"| {row['n']} |" in line


def test_the_report_states_model_scorer_counts_and_why_corpus_ppl_differs(tmp_path):
    frame = grouped_scores(100, 0.3, seed=22)
    markdown, _, _, summary = make_report(tmp_path, frame)
    data = json.loads(Path(summary).read_text())
    assert "`results/fluency/lm`" in markdown
    assert "proxy for toxicity" in markdown
    assert f"Texts: {data['n_texts']}; tokens scored: {data['n_tokens']}" in markdown
    assert f"| {data['corpus_ppl']:.2f} |" in markdown
    assert f"| {data['mean_text_ppl']:.2f} |" in markdown
    ratio = data["mean_text_ppl"] / data["corpus_ppl"]
    assert f"{ratio:.2f} times the corpus one" in markdown
    for value, entry in data["by_group"]["source"].items():
        assert f"| source | {value} | {entry['n_texts']} |" in markdown


def test_the_reading_follows_sign_interval_and_strength_of_the_numbers(tmp_path):
    strong, *_ = make_report(tmp_path / "strong", grouped_scores(300, 0.8, seed=23))
    assert "Pearson r = " in strong and "a strong positive association" in strong
    assert "excludes zero" in strong
    assert "less fluent texts (higher perplexity) tend to get higher toxicity scores." in strong

    negative, *_ = make_report(tmp_path / "negative", grouped_scores(300, -0.2, seed=24))
    assert "weak negative association" in negative
    assert "more fluent texts (lower perplexity) tend to get higher toxicity scores" in negative

    null, correlations, _, _ = make_report(tmp_path / "null", grouped_scores(40, 0.0, seed=25))
    overall = pd.read_csv(correlations).query("group_column == 'all' and method == 'pearson'")
    low, high = overall[["ci_low", "ci_high"]].iloc[0]
    assert low < 0 < high
    assert "includes zero, so these texts do not rule out no association" in null
    assert "but the CI does not exclude zero" in null


@pytest.mark.parametrize(
    ("estimate", "word"),
    [(0.05, "negligible"), (-0.2, "weak"), (0.3, "moderate"), (-0.49, "moderate"), (0.7, "strong")],
)
def test_strength_words_come_from_fixed_thresholds_on_the_absolute_value(estimate, word):
    assert report.strength(estimate) == word


def test_a_constant_toxicity_report_says_why_nothing_can_be_read(tmp_path):
    frame = grouped_scores(60, 0.0, seed=26)
    frame["toxicity"] = 0.0
    markdown, *_ = make_report(tmp_path, frame)
    assert "Pearson r: not available (toxicity is constant)." in markdown
    assert "no direction can be read" in markdown


def test_a_summary_without_a_key_is_named_and_leaves_no_report(tmp_path):
    frame = grouped_scores(30, 0.3, seed=27)
    summary = fake_summary(tmp_path / "s.json", frame)
    data = json.loads(summary.read_text())
    del data["corpus_ppl"]
    summary.write_text(json.dumps(data))
    args = argparse.Namespace(
        summary=str(summary), correlations="unused", binned="unused", out=str(tmp_path / "r.md")
    )
    with pytest.raises(DataError, match=re.escape(f"{summary}: missing key 'corpus_ppl'")):
        report.main(args)
    assert not (tmp_path / "r.md").exists()


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk, after checking the signature."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    assert data.endswith(b"IEND\xaeB`\x82")
    return struct.unpack(">II", data[16:24])


def draw(tmp_path: Path, frame: pd.DataFrame, groups: list[str]) -> list[Path]:
    """Write scores and binned means, run fluency-figures, return the three figure paths."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    frame.to_csv(tmp_path / "scores.csv", index=False)
    scores = load_scores(tmp_path / "scores.csv", groups)
    binned = binned_means(scores, block_settings("fluency", ("stats",), '{"n_bootstrap": 50}'))
    binned.to_csv(tmp_path / "binned.csv", index=False)
    out = tmp_path / "figures"
    paths = [out / "scatter.png", out / "binned.png", out / "by_group.png"]
    args = argparse.Namespace(
        scores=str(tmp_path / "scores.csv"),
        binned=str(tmp_path / "binned.csv"),
        group_columns=groups,
        out_scatter=str(paths[0]),
        out_binned=str(paths[1]),
        out_by_group=str(paths[2]),
    )
    assert figures.main(args) == 0
    return paths


def test_figures_are_valid_pngs_and_no_temporary_files_remain(tmp_path):
    paths = draw(tmp_path, grouped_scores(200, 0.4, seed=28), GROUPS)
    for path in paths:
        width, height = png_size(path)
        assert 400 < width < 3000 and 300 < height < 3000
    assert sorted(p.name for p in paths[0].parent.iterdir()) == sorted(p.name for p in paths)


def test_figures_handle_no_groups_many_texts_and_constant_toxicity(tmp_path):
    log_ppl, toxicity = correlated(2100, 0.3, seed=29)
    for path in draw(tmp_path / "many", make_scores(log_ppl, toxicity), []):
        png_size(path)
    for path in draw(tmp_path / "flat", make_scores(log_ppl[:50], np.zeros(50)), ["source"]):
        png_size(path)


def test_figure_annotations_are_the_numbers_of_the_correlations_table(tmp_path):
    frame = grouped_scores(200, 0.4, seed=30)
    table, _, _ = run_stats(tmp_path, frame, GROUPS, n_bootstrap=50)
    scores = load_scores(tmp_path / "scores.csv", GROUPS)
    subsets = {("all", "all"): scores}
    subsets |= {("condition", v): part for v, part in scores.groupby("condition")}
    for (column, group), part in subsets.items():
        text = figures.correlation_text(part)
        rows = table[(table["group_column"] == column) & (table["group"] == group)]
        for method, symbol in (("pearson", "Pearson r"), ("spearman", "Spearman ρ")):
            estimate = rows.loc[rows["method"] == method, "estimate"].iloc[0]
            assert f"{symbol} = {estimate:+.3f}" in text
        assert f"n = {len(part)}" in text


def test_figure_axes_name_units_and_mark_the_scorer_as_a_proxy(tmp_path):
    frame = grouped_scores(100, 0.4, seed=31)
    frame.to_csv(tmp_path / "scores.csv", index=False)
    scores = load_scores(tmp_path / "scores.csv", GROUPS)
    axes = figures.scatter_figure(scores).axes[0]
    assert axes.get_xlabel() == "log perplexity (nats/token)"
    assert "profanity-check" in axes.get_ylabel() and "proxy" in axes.get_ylabel()
    assert "100 texts" in axes.get_title()
