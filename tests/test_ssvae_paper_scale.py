"""Paper scale stays reachable: IDX files in, M2 and baseline trained, Table 1 set beside them.

A small IDX set is fabricated from 1,000 + 200 real digits (the embedded ones, written in the
torchvision layout), so a label fraction of 0.1 gives Table 1's 100 labels; every step is the
real `gpuflow` command a rule runs.
"""

from __future__ import annotations

import json
from pathlib import Path

from gpuflow.ssvae.data import IDX_NAMES, split_embedded
from tests.conftest import gpuflow
from tests.idx_files import write_idx
from tests.test_ssvae_train import step_arguments

SETTINGS = {
    "model": {"hidden": 16, "latent": 4},
    "train": {"epochs": 1, "batch_size": 300, "labelled_batch_size": 50, "learning_rate": 0.003,
              "eval_frequency": 1},
}  # fmt: skip


def fabricate_idx(root, n_train: int = 1000, n_test: int = 200) -> None:
    arrays = split_embedded(0.2, seed=0)
    small = {
        "x_train": arrays["x_train"][:n_train], "y_train": arrays["y_train"][:n_train],
        "x_test": arrays["x_test"][:n_test], "y_test": arrays["y_test"][:n_test],
    }  # fmt: skip
    for key, name in IDX_NAMES.items():
        write_idx(root / "MNIST" / "raw" / name, small[key])


def test_an_idx_grid_at_100_labels_is_reported_beside_kingma_et_al_table_1(tmp_path):
    fabricate_idx(tmp_path / "idx")
    data = tmp_path / "mnist.npz"
    source = {"data": {"source": "idx", "path": str(tmp_path / "idx")}}
    gpuflow("ssvae-data", "--settings", json.dumps(source), "--out", str(data))
    metrics = []
    for model, extra in (("m2", ["--alpha", "100"]), ("baseline", [])):
        outs = [str(tmp_path / model / f"seed{seed}.json") for seed in (0, 1)]
        gpuflow(
            "ssvae-train", "--model", model, "--data", str(data), "--frac", "0.1",
            "--corrupt", "0.0", *extra, "--seeds", "0", "1", *step_arguments(SETTINGS),
            "--out", *outs, "--threads", "1",
        )  # fmt: skip
        metrics += outs
    runs, summary = tmp_path / "runs.csv", tmp_path / "summary.csv"
    gpuflow("ssvae-aggregate", "--metrics", *metrics, "--out-runs", str(runs),
            "--out-summary", str(summary))  # fmt: skip
    gpuflow("ssvae-report", "--runs", str(runs), "--summary", str(summary),
            "--out", str(tmp_path / "summary.md"))  # fmt: skip

    text = (tmp_path / "summary.md").read_text()
    assert json.loads(Path(metrics[0]).read_text())["n_labelled"] == 100
    table = text[text.index("## Beside Kingma et al. (2014), Table 1") :]
    row = next(line for line in table.splitlines() if line.startswith("| 100 | 100 |"))
    assert row.endswith("| 11.97 ± 1.71 |")
    assert "this grid on 1000" in table
    assert "| 100 | 0 | 100 |" in text  # the paired gain at 100 labels, with its interval
