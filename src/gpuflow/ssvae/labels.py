"""Which training examples a run sees labelled, and which of those labels are corrupted."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuflow.errors import ConfigError

N_CLASSES = 10
SUBSET_STREAM, CORRUPTION_STREAM = 1, 2


@dataclass(frozen=True)
class LabelSplit:
    """One run's view of the training set."""

    labelled: np.ndarray  # indices into the training set
    labels: np.ndarray  # the labels the run sees (after corruption), aligned with `labelled`
    corrupted: np.ndarray  # bool, aligned with `labelled`
    unlabelled: np.ndarray  # indices of the other training examples


def n_labelled_for(fraction: float, n_train: int) -> int:
    """Labelled examples for a label fraction: round(fraction * n_train), at least one per class."""
    count = round(fraction * n_train)
    if not N_CLASSES <= count < n_train:
        raise ConfigError(
            "ssvae.grid.fractions",
            f"{fraction} of {n_train} training examples gives {count} labels",
            f"at least {N_CLASSES} and fewer than {n_train}",
        )
    return count


def labelled_subset(labels: np.ndarray, count: int, seed: int) -> np.ndarray:
    """`count` training indices, balanced over classes (remainder to random classes), seeded."""
    rng = np.random.default_rng([seed, SUBSET_STREAM])
    per_class = np.full(N_CLASSES, count // N_CLASSES)
    per_class[rng.choice(N_CLASSES, count % N_CLASSES, replace=False)] += 1
    chosen = []
    for digit in range(N_CLASSES):
        members = np.flatnonzero(labels == digit)
        if len(members) < per_class[digit]:
            raise ConfigError(
                "ssvae.grid.fractions",
                f"class {digit} has {len(members)} examples, {per_class[digit]} asked for",
            )
        chosen.append(rng.choice(members, per_class[digit], replace=False))
    return np.sort(np.concatenate(chosen))


def corrupt_labels(labels: np.ndarray, rate: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Replace exactly round(rate * n) labels by a different class drawn uniformly, seeded."""
    n = len(labels)
    rng = np.random.default_rng([seed, CORRUPTION_STREAM])
    order = rng.permutation(n)
    shifts = rng.integers(1, N_CLASSES, size=n)
    chosen = order[: round(rate * n)]
    corrupted = np.zeros(n, dtype=bool)
    corrupted[chosen] = True
    new = labels.copy()
    new[chosen] = (labels[chosen] + shifts[chosen]) % N_CLASSES
    return new, corrupted


def split_labels(train_labels: np.ndarray, fraction: float, rate: float, seed: int) -> LabelSplit:
    """The labelled subset, its (corrupted) labels and the unlabelled rest for one run."""
    labelled = labelled_subset(train_labels, n_labelled_for(fraction, len(train_labels)), seed)
    labels, corrupted = corrupt_labels(train_labels[labelled], rate, seed)
    unlabelled = np.setdiff1d(np.arange(len(train_labels)), labelled)
    return LabelSplit(labelled, labels, corrupted, unlabelled)
