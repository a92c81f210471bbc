"""`gpuflow fluency-stats`: correlations of log-perplexity with toxicity, CIs, binned means."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from gpuflow.errors import ConfigError, DataError
from gpuflow.fluency import stats
from gpuflow.settings.blocks import block_settings

SCORER = "profanity-check (alt-profanity-check)"


def make_scores(
    log_ppl: np.ndarray,
    toxicity: np.ndarray,
    n_tokens: np.ndarray | None = None,
    **groups: np.ndarray,
) -> pd.DataFrame:
    """A scores.csv frame as the merge step writes it, from chosen log-ppl, toxicity, lengths."""
    n = len(log_ppl)
    n_tokens = np.full(n, 50) if n_tokens is None else np.asarray(n_tokens)
    frame = pd.DataFrame(
        {
            "text_id": [f"t{i}" for i in range(n)],
            "text": ["some words"] * n,
            "source": groups.pop("source", np.array(["imdb"] * n)),
            "condition": groups.pop("condition", np.array(["original"] * n)),
            **groups,
            "nll_sum": np.asarray(log_ppl) * n_tokens,
            "n_tokens": n_tokens,
            "ppl": np.exp(log_ppl),
            "toxicity": toxicity,
            "toxicity_scorer": SCORER,
        }
    )
    return frame


def correlated(n: int, rho: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Bivariate normal (log-ppl around 4, toxicity) with Pearson correlation rho."""
    rng = np.random.default_rng(seed)
    a, b = rng.normal(size=(2, n))
    return 4 + 0.5 * a, rho * a + math.sqrt(1 - rho**2) * b


def run_stats(
    tmp_path: Path, frame: pd.DataFrame, groups: list[str], **settings: float
) -> tuple[pd.DataFrame, dict, pd.DataFrame]:
    """Write scores.csv, run the step's main, read back its three outputs."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    scores = tmp_path / "scores.csv"
    frame.to_csv(scores, index=False)
    out = tmp_path / "stats"
    args = argparse.Namespace(
        scores=str(scores),
        group_columns=groups,
        settings=json.dumps({"n_bootstrap": 300, **settings}),
        out_correlations=str(out / "correlations.csv"),
        out_json=str(out / "correlations.json"),
        out_binned=str(out / "binned.csv"),
    )
    assert stats.main(args) == 0

    def strict(constant: str) -> None:
        raise AssertionError(f"non-JSON constant {constant} in correlations.json")

    document = json.loads((out / "correlations.json").read_text(), parse_constant=strict)
    return (
        pd.read_csv(
            out / "correlations.csv", dtype={"group": str}, keep_default_na=False, na_values=[""]
        ),
        document,
        pd.read_csv(out / "binned.csv"),
    )


def row(table: pd.DataFrame, method: str, column: str = "all", group: str = "all") -> pd.Series:
    selected = table[
        (table["group_column"] == column) & (table["group"] == group) & (table["method"] == method)
    ]
    assert len(selected) == 1
    return selected.iloc[0]


def test_estimates_equal_scipy_and_bootstrap_cis_cover_the_true_correlation(tmp_path):
    rho = 0.6
    log_ppl, toxicity = correlated(1000, rho, seed=1)
    table, _, _ = run_stats(tmp_path, make_scores(log_ppl, toxicity), [], n_bootstrap=1000)
    truth = {
        "pearson": rho,
        "spearman": 6 / math.pi * math.asin(rho / 2),
        "kendall": 2 / math.pi * math.asin(rho),
    }
    reference = {
        "pearson": sps.pearsonr(log_ppl, toxicity),
        "spearman": sps.spearmanr(log_ppl, toxicity),
        "kendall": sps.kendalltau(log_ppl, toxicity),
    }
    for method, true_value in truth.items():
        got = row(table, method)
        assert got["estimate"] == pytest.approx(reference[method].statistic, abs=1e-12)
        assert got["p_value"] == pytest.approx(reference[method].pvalue, rel=1e-9)
        assert got["ci_low"] < true_value < got["ci_high"], method
        assert got["ci_high"] - got["ci_low"] < 0.15
        assert got["n"] == 1000 and got["n_boot_valid"] == 1000
        assert pd.isna(got["reason"])


def test_vectorised_bootstrap_statistics_equal_scipy_on_every_resample():
    rng = np.random.default_rng(0)
    x = rng.normal(size=60)
    y = np.round(x + rng.normal(size=60), 1)  # ties in y, as the toxicity of shuffled twins has
    z = np.log(rng.integers(5, 50, size=60))  # ties in length too
    index = rng.integers(0, 60, size=(25, 60))
    variables = stats.Variable.of(x), stats.Variable.of(y), stats.Variable.of(z)
    methods = list(stats.METHODS)
    fast = stats.resample_statistics(*variables, index, methods, stats.kendall_signs(x, y))
    slow = stats.resample_statistics(*variables, index, methods)

    def residual(v: np.ndarray, covariate: np.ndarray) -> np.ndarray:
        return v - np.polyval(np.polyfit(covariate, v, 1), covariate)

    for r, resample in enumerate(index):
        a, b, c = x[resample], y[resample], z[resample]
        ra, rb, rc = (sps.rankdata(v) for v in (a, b, c))
        expected = {
            "pearson": sps.pearsonr(a, b).statistic,
            "spearman": sps.spearmanr(a, b).statistic,
            "kendall": sps.kendalltau(a, b).statistic,
            "partial_pearson": sps.pearsonr(residual(a, c), residual(b, c)).statistic,
            "partial_spearman": sps.pearsonr(residual(ra, rc), residual(rb, rc)).statistic,
        }
        for method, value in expected.items():
            assert fast[method][r] == pytest.approx(value, abs=1e-10), method
            assert slow[method][r] == pytest.approx(value, abs=1e-10), method


def test_a_resample_with_a_single_distinct_value_gives_nan_not_a_number():
    x, y, z = (stats.Variable.of(v) for v in ([1.0, 2.0, 3.0], [0.0, 0.5, 1.0], [1.0, 1.0, 2.0]))
    index = np.array([[0, 0, 0], [1, 2, 1]])
    got = stats.resample_statistics(x, y, z, index, ["pearson", "spearman", "kendall"])
    assert np.isnan(got["pearson"][0]) and np.isnan(got["spearman"][0])
    assert np.isnan(got["kendall"][0])
    assert got["pearson"][1] == pytest.approx(1.0)


def test_same_seed_gives_the_same_intervals_and_another_seed_different_ones(tmp_path):
    frame = make_scores(*correlated(300, 0.3, seed=3))
    first, _, binned_first = run_stats(tmp_path / "a", frame, [], seed=7)
    again, _, binned_again = run_stats(tmp_path / "b", frame, [], seed=7)
    other, _, binned_other = run_stats(tmp_path / "c", frame, [], seed=8)
    columns = ["estimate", "ci_low", "ci_high"]
    pd.testing.assert_frame_equal(first[columns], again[columns])
    pd.testing.assert_frame_equal(binned_first, binned_again)
    assert (first["estimate"] == other["estimate"]).all()
    assert (first["ci_low"] != other["ci_low"]).all()
    assert (binned_first["ci_low"] != binned_other["ci_low"]).any()


def test_partial_correlation_removes_a_pure_length_confound(tmp_path):
    rng = np.random.default_rng(4)
    n_tokens = np.round(np.exp(rng.uniform(np.log(5), np.log(500), 800))).astype(int)
    length = np.log(n_tokens)
    log_ppl = 2 + 0.6 * length + 0.3 * rng.normal(size=800)
    toxicity = 0.2 * length + 0.1 * rng.normal(size=800)
    table, _, _ = run_stats(tmp_path, make_scores(log_ppl, toxicity, n_tokens), [])
    assert row(table, "pearson")["estimate"] > 0.7
    assert row(table, "spearman")["estimate"] > 0.7
    for method in ("partial_pearson", "partial_spearman"):
        partial = row(table, method)
        assert abs(partial["estimate"]) < 0.1
        assert partial["ci_low"] < 0 < partial["ci_high"]


def test_each_group_value_gets_its_own_rows_and_tiny_groups_say_why(tmp_path):
    log_ppl, toxicity = correlated(202, 0.5, seed=5)
    condition = np.array(["original", "shuffled"] * 101)
    source = np.array(["imdb"] * 200 + ["rotten_tomatoes"] * 2)
    frame = make_scores(log_ppl, toxicity, condition=condition, source=source)
    table, document, _ = run_stats(tmp_path, frame, ["condition", "source"])
    assert set(zip(table["group_column"], table["group"], strict=True)) == {
        ("all", "all"),
        ("condition", "original"),
        ("condition", "shuffled"),
        ("source", "imdb"),
        ("source", "rotten_tomatoes"),
    }
    assert len(table) == 5 * len(stats.METHODS)
    shuffled = condition == "shuffled"
    expected = sps.spearmanr(log_ppl[shuffled], toxicity[shuffled]).statistic
    assert row(table, "spearman", "condition", "shuffled")["estimate"] == pytest.approx(expected)
    assert row(table, "spearman", "condition", "shuffled")["n"] == 101
    tiny = table[table["group"] == "rotten_tomatoes"]
    assert tiny["estimate"].isna().all() and tiny["ci_low"].isna().all()
    assert tiny["reason"].str.contains("fewer than").all()
    nested = document["by_group"]["source"]["rotten_tomatoes"]["pearson"]
    assert nested["estimate"] is None and "fewer than 3 texts" in nested["reason"]
    assert document["overall"]["kendall"]["estimate"] == pytest.approx(
        row(table, "kendall")["estimate"]
    )


def test_binned_means_are_quantile_bins_with_bootstrap_intervals(tmp_path):
    rng = np.random.default_rng(6)
    log_ppl = rng.permutation(np.linspace(2, 6, 100))
    toxicity = log_ppl / 10 + 0.05 * rng.normal(size=100)
    _, _, binned = run_stats(tmp_path, make_scores(log_ppl, toxicity), [], n_bins=5)
    assert list(binned["bin"]) == [1, 2, 3, 4, 5]
    assert (binned["n"] == 20).all()
    order = np.argsort(log_ppl)
    for b, members in enumerate(np.split(order, 5)):
        got = binned.iloc[b]
        assert got["mean_toxicity"] == pytest.approx(toxicity[members].mean())
        assert got["mean_logppl"] == pytest.approx(log_ppl[members].mean())
        assert got["logppl_min"] == pytest.approx(log_ppl[members].min())
        assert got["ci_low"] < got["mean_toxicity"] < got["ci_high"]
    assert (binned["logppl_max"].iloc[:-1].to_numpy() < binned["logppl_min"].iloc[1:]).all()


def test_tied_log_perplexities_share_a_bin_so_fewer_bins_may_remain(tmp_path):
    log_ppl = np.array([3.0] * 60 + [4.0] * 30 + [5.0] * 10)
    toxicity = np.random.default_rng(7).uniform(size=100)
    _, _, binned = run_stats(tmp_path, make_scores(log_ppl, toxicity), [], n_bins=10)
    assert list(binned["n"]) == [60, 30, 10]
    assert list(binned["logppl_min"]) == list(binned["logppl_max"]) == [3.0, 4.0, 5.0]


def test_constant_toxicity_gives_nan_with_a_reason_instead_of_crashing(tmp_path):
    log_ppl, _ = correlated(50, 0.0, seed=8)
    table, document, binned = run_stats(tmp_path, make_scores(log_ppl, np.zeros(50)), [])
    assert table["estimate"].isna().all() and table["p_value"].isna().all()
    assert (table["reason"] == "toxicity is constant").all()
    assert document["overall"]["pearson"]["estimate"] is None
    assert (binned["mean_toxicity"] == 0).all()


def test_fewer_than_three_texts_give_nan_with_a_reason(tmp_path):
    table, _, binned = run_stats(tmp_path, make_scores(np.array([3.0, 4.0]), np.zeros(2)), [])
    assert table["estimate"].isna().all()
    assert table["reason"].str.startswith("fewer than").all()
    assert binned["n"].sum() == 2


def test_rare_nonzero_toxicity_still_gets_intervals_and_says_how_many_resamples_counted(
    tmp_path,
):
    log_ppl, _ = correlated(40, 0.0, seed=9)
    toxicity = np.zeros(40)
    toxicity[:3] = [0.9, 0.8, 0.7]
    table, _, _ = run_stats(tmp_path, make_scores(log_ppl, toxicity), [])
    pearson = row(table, "pearson")
    assert math.isfinite(pearson["ci_low"])
    assert pearson["n_boot_valid"] < pearson["n_bootstrap"]
    assert f"{pearson['n_boot_valid']} of 300 resamples" in pearson["reason"]


def test_a_missing_column_names_the_file_and_the_column_and_leaves_no_output(tmp_path):
    frame = make_scores(*correlated(20, 0.5, seed=10)).drop(columns=["toxicity"])
    with pytest.raises(DataError) as error:
        run_stats(tmp_path, frame, [])
    assert str(tmp_path / "scores.csv") in str(error.value)
    assert "missing column 'toxicity'" in str(error.value)
    assert not (tmp_path / "stats").exists() or not any((tmp_path / "stats").iterdir())


def test_a_missing_group_column_is_named(tmp_path):
    frame = make_scores(*correlated(20, 0.5, seed=10))
    with pytest.raises(DataError, match="missing column 'model'"):
        run_stats(tmp_path, frame, ["model"])


def test_a_bad_perplexity_value_names_the_row(tmp_path):
    frame = make_scores(*correlated(20, 0.5, seed=11))
    frame.loc[4, "ppl"] = -1.0
    with pytest.raises(DataError, match=r"row 6: ppl -1.0 is not a positive finite number"):
        run_stats(tmp_path, frame, [])


def test_a_text_scored_twice_names_the_row_rather_than_counting_it_twice(tmp_path):
    frame = make_scores(*correlated(20, 0.5, seed=12))
    frame.loc[7, "text_id"] = frame.loc[2, "text_id"]
    with pytest.raises(DataError, match=r"row 9: text id .* again"):
        run_stats(tmp_path, frame, [])


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ('{"n_boot": 100}', "fluency.stats.n_boot"),
        ('{"confidence": 1.5}', "fluency.stats.confidence"),
        ('{"n_bins": 1}', "fluency.stats.n_bins"),
        ("[1, 2]", "fluency.stats"),
    ],
)
def test_bad_settings_name_the_config_key(settings, key):
    with pytest.raises(ConfigError) as error:
        block_settings("fluency", ("stats",), settings)
    assert error.value.key == key


def test_the_cli_reports_a_missing_column_in_one_line_with_exit_status_2(tmp_path, run_gpuflow):
    scores = tmp_path / "scores.csv"
    make_scores(*correlated(20, 0.5, seed=12)).drop(columns=["n_tokens"]).to_csv(scores)
    result = run_gpuflow(
        "fluency-stats",
        "--scores",
        str(scores),
        "--out-correlations",
        str(tmp_path / "c.csv"),
        "--out-json",
        str(tmp_path / "c.json"),
        "--out-binned",
        str(tmp_path / "b.csv"),
        check=False,
    )
    assert result.returncode == 2
    assert f"{scores}: missing column 'n_tokens'" in result.stderr
    assert "Traceback" not in result.stderr
    # no output: only the failed job's record, in the jobs folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jobs", "scores.csv"]


def test_group_labels_na_none_null_are_labels_and_only_an_empty_cell_is_missing(tmp_path):
    labels = ["NA", "None", "null", "", "gpt2"]
    log_ppl, toxicity = correlated(100, 0.3, seed=2)
    frame = make_scores(log_ppl, toxicity, model=np.repeat(labels, 20))
    table, document, _ = run_stats(tmp_path, frame, ["model"])
    groups = table[table["group_column"] == "model"].drop_duplicates("group")
    assert dict(zip(groups["group"], groups["n"], strict=True)) == {
        "NA": 20, "None": 20, "null": 20, stats.MISSING_GROUP: 20, "gpt2": 20,
    }  # fmt: skip
    assert set(document["by_group"]["model"]) == {"NA", "None", "null", "(missing)", "gpt2"}
