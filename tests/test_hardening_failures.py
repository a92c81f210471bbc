"""Failure paths that used to end in a traceback or in silence: each is now one clear line.

A loss that becomes NaN stops training naming the run, the epoch and the loss term, and keeps the
last good resume state; config files with a key given twice, a NaN or infinite number, or bytes
that are not UTF-8 stop the workflow naming the file and the key.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gpuflow.job.divergence import TrainingDivergedError
from gpuflow.job.paths import STATE, job_file
from gpuflow.settings.validate import load_config, merge_config
from gpuflow.ssvae.data import split_embedded
from gpuflow.ssvae.train import Run, train, train_settings
from tests.conftest import BIN, REPO, gpuflow, workflow_env
from tests.test_scaling_ddp import prepare, settings, train_command

LOWER = " (lower the learning rate or check the data)"


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    """1,000 training and 200 test digits of the embedded MNIST sample, prepared."""
    arrays = split_embedded(0.2, seed=0)
    path = tmp_path_factory.mktemp("ssvae") / "mnist.npz"
    np.savez(
        path,
        x_train=arrays["x_train"][:1000],
        y_train=arrays["y_train"][:1000],
        x_test=arrays["x_test"][:200],
        y_test=arrays["y_test"][:200],
    )
    return path


def test_an_ssvae_loss_that_becomes_nan_stops_naming_run_epoch_and_term(digits, tmp_path):
    run = Run("m2", 0.1, 0.0, 1.0, 0)
    too_fast = merge_config(train_settings(), {
        "model": {"hidden": 32, "latent": 4},
        "train": {"batch_size": 50, "labelled_batch_size": 20, "learning_rate": 1000.0,
                  "eval_batch_size": 250, "epochs": 3, "device": "cpu"},
    })  # fmt: skip
    out = tmp_path / "metrics.json"
    with pytest.raises(TrainingDivergedError) as stopped:
        train([run], digits, too_fast, [out])
    assert str(stopped.value) == (
        "run model=m2 frac=0.1 corrupt=0.0 alpha=1.0 seed=0: loss term 'train_labelled' is nan"
        " at epoch 1; training stopped, no earlier state to keep" + LOWER
    )
    assert not out.exists(), "no metrics from a diverged run"


def test_a_ddp_loss_that_becomes_nan_stops_and_keeps_the_last_good_state(tmp_path):
    data, out = prepare(tmp_path / "data"), tmp_path / "run"
    out.mkdir()
    # Epoch 1 trains as usual; a weight turns NaN as epoch 2 starts (tests/scaling_faults.py).
    step = train_command(data, out, settings(epochs=4), 1)[1:]
    faulted = [sys.executable, "-m", "tests.scaling_faults", "2", "--", *step]
    result = subprocess.run(faulted, capture_output=True, text=True, env=workflow_env(), cwd=REPO)
    state = job_file(out / "run.json", STATE)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "gpuflow scaling-train: error: run tiny world=1: loss term 'train_loss' is nan at epoch 2;"
        f" training stopped, the last good state (after epoch 1) is kept in {state}" + LOWER
    )
    assert "Traceback" not in result.stderr
    kept = torch.load(state, weights_only=True)["data"]
    assert kept["epoch"] == 1
    assert all(torch.isfinite(w).all() for w in kept["model"].values())
    assert all(math.isfinite(e["train_loss"]) for e in kept["history"])
    assert not (out / "run.json").exists() and not (out / "model.pt").exists()


BAD_CONFIG_FILES = {
    "a key given twice": (
        b"families: [sweep]\nsweep:\n  n_seeds: 3\n  shard_size: 2\n  n_seeds: 30\n",
        "{path}: key 'sweep.n_seeds' is given twice (lines 3 and 5); YAML keeps only the last"
        " (expected each key once)",
    ),
    "a NaN": (
        b"families: [sweep]\nsweep:\n  gd:\n    lr: .nan\n",
        "config key 'sweep.gd.lr': nan is not a finite number in {path} (expected a finite number)",
    ),
    "an infinity in a list": (
        b"families: [ssvae]\nssvae:\n  grid:\n    alphas: [1.0, .inf]\n",
        "config key 'ssvae.grid.alphas.1': inf is not a finite number in {path}"
        " (expected a finite number)",
    ),
    "a file in Latin-1": (
        b"families: [sweep]\n# r\xe9sum\xe9 of the sweep\n",
        "{path}: not UTF-8 text (byte 21 is 0xe9) (expected a YAML file saved as UTF-8)",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIG_FILES))
def test_a_bad_config_file_is_one_line_naming_file_and_key(tmp_path, case):
    content, message = BAD_CONFIG_FILES[case]
    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    doctor = gpuflow("doctor", "--configfile", str(REPO / "config/config.yaml"), str(path),
                     check=False)  # fmt: skip
    assert doctor.returncode == 2
    assert doctor.stderr.strip() == f"gpuflow doctor: error: {message.format(path=path)}"
    if case == "a file in Latin-1":
        return  # Snakemake itself reads --configfile files before any workflow code runs
    workflow = subprocess.run(
        [str(BIN / "snakemake"), "--snakefile", str(REPO / "Snakefile"), "--directory",
         str(tmp_path), "--configfile", str(path), "--cores", "1", "--dry-run"],
        capture_output=True, text=True, env=workflow_env(),
    )  # fmt: skip
    output = workflow.stdout + workflow.stderr
    assert workflow.returncode != 0
    assert message.format(path=path) in output.splitlines(), output
    assert "Traceback" not in output


def test_the_shipped_configs_pass_the_strict_reading():
    assert load_config(REPO / "config/config.yaml", REPO / "config/paper.yaml")["families"]


def test_the_working_directorys_default_config_is_read_strictly_like_any_other(tmp_path):
    """Snakemake reads `configfile: config/config.yaml` from the working directory (--directory
    DIR: DIR/config/config.yaml), so that is the file the strict reading checks."""
    content, message = BAD_CONFIG_FILES["a key given twice"]
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_bytes(content)
    workflow = subprocess.run(
        [str(BIN / "snakemake"), "--snakefile", str(REPO / "Snakefile"), "--directory",
         str(tmp_path), "--cores", "1", "--dry-run"],
        capture_output=True, text=True, env=workflow_env(),
    )  # fmt: skip
    output = workflow.stdout + workflow.stderr
    assert workflow.returncode != 0
    assert message.format(path="config/config.yaml") in output.splitlines(), output
