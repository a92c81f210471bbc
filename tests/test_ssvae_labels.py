"""Which digits a run sees labelled, and how its labels are corrupted."""

from __future__ import annotations

import numpy as np
import pytest

from gpuflow.errors import ConfigError
from gpuflow.ssvae.labels import corrupt_labels, labelled_subset, n_labelled_for, split_labels

LABELS = np.repeat(np.arange(10), 60)


@pytest.mark.parametrize(
    ("rate", "n", "expected"),
    [(0.0, 50, 0), (0.1, 50, 5), (0.3, 40, 12), (0.25, 37, 9), (1.0, 20, 20)],
)
def test_corruption_changes_exactly_round_rate_times_n_labels(rate, n, expected):
    labels = LABELS[:n]
    new, corrupted = corrupt_labels(labels, rate, seed=3)
    assert corrupted.sum() == expected == round(rate * n)
    assert (new != labels).sum() == expected
    assert np.array_equal(new[~corrupted], labels[~corrupted])


def test_a_corrupted_label_is_never_the_true_class_and_all_others_occur():
    labels = np.zeros(9000, dtype=np.int64)
    new, corrupted = corrupt_labels(labels, 1.0, seed=0)
    assert corrupted.all() and (new != 0).all()
    counts = np.bincount(new, minlength=10)[1:]
    assert counts.min() > 0.8 * 1000 and counts.max() < 1.2 * 1000  # uniform over the other nine


def test_corruption_is_seeded_and_nested_across_rates():
    a, mask_a = corrupt_labels(LABELS, 0.2, seed=5)
    b, _ = corrupt_labels(LABELS, 0.2, seed=5)
    c, _ = corrupt_labels(LABELS, 0.2, seed=6)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    low, mask_low = corrupt_labels(LABELS, 0.1, seed=5)
    assert (mask_low <= mask_a).all()
    assert np.array_equal(low[mask_low], a[mask_low])


def test_the_labelled_subset_is_balanced_over_classes_and_seeded():
    chosen = labelled_subset(LABELS, 43, seed=1)
    counts = np.bincount(LABELS[chosen], minlength=10)
    assert len(np.unique(chosen)) == 43 and counts.min() == 4 and counts.max() == 5
    assert np.array_equal(chosen, labelled_subset(LABELS, 43, seed=1))
    assert not np.array_equal(chosen, labelled_subset(LABELS, 43, seed=2))


def test_a_split_leaves_the_other_digits_unlabelled_and_shares_its_subset_across_rates():
    clean = split_labels(LABELS, 0.1, 0.0, seed=4)
    noisy = split_labels(LABELS, 0.1, 0.5, seed=4)
    assert len(clean.labelled) == 60 and len(clean.unlabelled) == 540
    assert not np.intersect1d(clean.labelled, clean.unlabelled).size
    assert np.array_equal(clean.labelled, noisy.labelled)
    assert np.array_equal(clean.labels, LABELS[clean.labelled])
    assert noisy.corrupted.sum() == 30


@pytest.mark.parametrize("fraction", [0.001, 1.0])
def test_a_fraction_giving_too_few_or_all_labels_names_the_config_key(fraction):
    with pytest.raises(ConfigError, match=r"ssvae\.grid\.fractions"):
        n_labelled_for(fraction, 4000)


def test_fractions_of_60000_idx_digits_give_kingmas_label_counts():
    counts = [n_labelled_for(f, 60000) for f in (0.00167, 0.01, 0.01667, 0.05)]
    assert counts == [100, 600, 1000, 3000]
