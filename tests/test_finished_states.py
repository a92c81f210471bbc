"""A job that ends after writing its outputs loses no work: its resume state outlives it.

On SLURM a job can reach its time limit (or be preempted) after its step wrote the outputs; the
job is then TIMEOUT, Snakemake removes its outputs, and the retry must resume after the last
epoch instead of training again. Under the workflow a step therefore keeps its state, recorded
in the run's records folder, and the run removes it once the outputs exist.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from gpuflow.job.finished_states import RECORDS_ENV, clean, release
from gpuflow.job.paths import PROGRESS, STATE, job_file
from gpuflow.settings.validate import merge_config
from gpuflow.ssvae.data import split_embedded
from gpuflow.ssvae.train import Run, train, train_settings

EPOCHS = 3
TINY = merge_config(
    train_settings(),
    {
        "model": {"hidden": 16, "latent": 4},
        "train": {
            "batch_size": 100,
            "labelled_batch_size": 20,
            "eval_batch_size": 200,
            "epochs": EPOCHS,
            "eval_frequency": 1,
            "device": "cpu",
        },
    },
)
RUNS = [Run("m2", 0.05, 0.0, 1.0, seed) for seed in (0, 1)]


@pytest.fixture
def records(tmp_path, monkeypatch):
    """The records folder of a workflow run, as the Snakefile sets it for every job."""
    folder = tmp_path / "records"
    monkeypatch.setenv(RECORDS_ENV, str(folder))
    return folder


@pytest.fixture(scope="module")
def data_path(tmp_path_factory):
    arrays = split_embedded(0.2, seed=0)
    small = {key: arrays[key][: 600 if "train" in key else 200] for key in arrays}
    path = tmp_path_factory.mktemp("digits") / "mnist.npz"
    np.savez(path, **small)
    return path


def without_timing(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k not in ("timing", "run_record")}


def test_a_step_run_by_hand_drops_its_state_with_its_outputs_written(tmp_path, monkeypatch):
    monkeypatch.delenv(RECORDS_ENV, raising=False)
    state, out = tmp_path / "state.pt", tmp_path / "out.csv"
    state.write_bytes(b"state")
    out.write_text("done")
    release([state], outputs=[out])
    assert not state.exists()


def test_the_run_removes_a_kept_state_only_once_all_its_outputs_exist(tmp_path, records):
    state, progress = tmp_path / "state.pt", tmp_path / "progress.jsonl"
    outputs = [tmp_path / "out.csv", tmp_path / "out.run.json"]
    state.write_bytes(b"state")
    progress.write_text("{}")
    release([state, progress], outputs=outputs)
    assert state.exists() and progress.exists(), "kept until the outputs are accepted"
    outputs[0].write_text("done")
    assert clean(records) == [] and state.exists(), "an output is missing: the job failed"
    outputs[1].write_text("{}")
    assert clean(records) == [state.resolve(), progress.resolve()]
    assert not state.exists() and not progress.exists() and list(records.iterdir()) == []


def test_a_record_whose_state_is_gone_or_unreadable_is_dropped(tmp_path, records):
    release([tmp_path / "never-written.pt"], outputs=[tmp_path / "missing.csv"])
    (records / "torn.json").write_text('{"files": [')
    assert clean(records) == [] and list(records.iterdir()) == []


def test_training_whose_outputs_were_removed_after_it_ended_resumes_after_its_last_epoch(
    data_path, tmp_path, records, capsys
):
    outs = [tmp_path / f"seed{s}.json" for s in (0, 1)]
    state, progress = job_file(outs[0], STATE), job_file(outs[0], PROGRESS)
    first = train(RUNS, data_path, TINY, outs)
    assert state.exists(), "the state outlives the outputs until the run accepts them"
    for out in outs:  # what Snakemake does to the outputs of a job SLURM reports TIMEOUT
        out.unlink()
    capsys.readouterr()
    again = train(RUNS, data_path, TINY, outs)
    log = capsys.readouterr().out
    assert f"resumed from {state} after epoch {EPOCHS}" in log
    assert "epoch 1/" not in log and f"epoch {EPOCHS}/" not in log, "no epoch trained again"
    assert again[0]["timing"]["resumed_from_epoch"] == EPOCHS
    for before, after, out in zip(first, again, outs, strict=True):
        assert without_timing(after) == without_timing(before)
        assert without_timing(json.loads(out.read_text())) == without_timing(before)
    assert clean(records) == [state.resolve(), progress.resolve()]
    assert not state.exists() and not progress.exists()
