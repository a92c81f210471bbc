"""Runs in the experiment tracker (config `telemetry.tracker`, docs/tracking.md), read back by
TensorBoard's own reader: every training run of the workflow is a run there with its parameters,
tags and curves; a resumed job continues its run, each epoch once; switching the tracker re-runs
nothing; a tracker that cannot log never fails a run and says so once."""

from __future__ import annotations

import copy
import json
import math
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer
from tensorboard.plugins.hparams import metadata

from benchmarks.tracking_cost import TRAINING_RULES
from gpuflow.job import Job
from gpuflow.job.state import State
from gpuflow.settings.blocks import family_settings
from gpuflow.ssvae.train import Run, train
from tests.conftest import snakemake, tiny_config
from tests.test_ssvae_train import data_path, tiny

__all__ = ["data_path"]  # the fixture, shared with the SSVAE training tests

TINY = tiny_config("all")
NOTHING_TO_DO = "Nothing to be done"


def tracker_on(config: dict[str, Any], folder: str = "results/tracking") -> dict[str, Any]:
    """`config` with the TensorBoard tracker on, writing to `folder`."""
    changed = copy.deepcopy(config)
    changed["telemetry"] = {**changed.get("telemetry", {}), "tracker": "tensorboard"}
    changed["telemetry"]["tracker_folder"] = folder
    return changed


def tensorboard(folder: Path) -> EventMultiplexer:
    """The runs under `folder` as TensorBoard loads them for `tensorboard --logdir folder`."""
    runs = EventMultiplexer(size_guidance={"scalars": 0, "tensors": 0})
    runs.AddRunsFromDirectory(str(folder))
    runs.Reload()
    return runs


def parameters(runs: EventMultiplexer, run: str) -> dict[str, Any]:
    """The run's parameters and tags, as the HParams dashboard reads them."""
    content = runs.PluginRunToTagToContent(metadata.PLUGIN_NAME)[run]
    start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
    return {name: getattr(v, v.WhichOneof("kind")) for name, v in start.hparams.items()}


def steps(runs: EventMultiplexer, run: str, tag: str) -> list[int]:
    """The steps of the run's curve `tag`, in order."""
    return [event.step for event in runs.Scalars(run, tag)]


def family_of(run: str) -> str:
    return Path(run).parts[0]


def expected_runs(config: dict[str, Any]) -> dict[str, int]:
    """Training runs per family of the `.test/all` grid: one per seed of each SSVAE grid point
    (M2 and baseline), per scaling configuration and world size, per sweep shard; one LM."""
    ssvae = config["ssvae"]["grid"]
    points = len(ssvae["fractions"]) * len(ssvae["corruption_rates"])
    m2 = points * len(ssvae["alphas"]) * len(ssvae["seeds"])
    sweep = config["sweep"]
    shards = math.ceil(sweep["n_seeds"] / sweep["shard_size"])
    cells = len(sweep["teacher_ranks"]) * len(sweep["student_widths"]) * 2  # gd and gnc
    scaling = config["scaling"]
    return {
        "fluency": 1,
        "ssvae": m2 + points * len(ssvae["seeds"]),
        "scaling": len(scaling["run"]) * len(scaling["world_sizes"]),
        "sweep": cells * shards,
    }


@pytest.fixture(scope="module")
def tracked(finished_all, tmp_path_factory) -> Path:
    """The training rules of `.test/all` run again with the tracker on, over a copy of the
    session's finished run (tracker off), which holds the data they need."""
    workdir = tmp_path_factory.mktemp("tracked") / "run"
    shutil.copytree(finished_all, workdir, symlinks=True)
    snakemake(workdir, tracker_on(TINY), "--forcerun", *TRAINING_RULES, "--until", *TRAINING_RULES)
    return workdir


@pytest.mark.workflow
def test_tensorboard_finds_every_training_run_with_its_parameters_and_curves(tracked):
    runs = tensorboard(tracked / "results" / "tracking")
    names = sorted(runs.Runs())
    counts = {family: 0 for family in expected_runs(TINY)}
    for name in names:
        counts[family_of(name)] += 1
    assert counts == expected_runs(TINY), names

    for name in names:
        params = parameters(runs, name)
        family = family_of(name)
        assert params["tag.family"] == family and params["tag.host"], name
        assert params["tag.step"] and params["tag.gpus"] and "tag.slurm_job_id" in params, name
        for part in Path(name).parts:
            if "~" in part:
                key, value = part.split("~", 1)
                assert params[f"tag.{key}"] == value, (name, key)
        if family == "ssvae":
            epochs = TINY["ssvae"]["train"]["epochs"]
            assert params["run.seed"] == float(params["tag.seed"]) and params["model.hidden"] > 0
            assert params["train.epochs"] == epochs
            assert steps(runs, name, "train_loss") == list(range(1, epochs + 1)), name
            assert steps(runs, name, "final/test_accuracy") == [epochs], name
        elif family == "scaling":
            epochs = TINY["scaling"]["configurations"][params["configuration"]]["train"]["epochs"]
            assert params["world_size"] == float(params["tag.world"]), name
            assert steps(runs, name, "train_loss") == list(range(1, epochs + 1)), name
            assert steps(runs, name, "final/val_accuracy") == [epochs], name
        elif family == "sweep":
            start, stop = (int(seed) for seed in params["seeds"].split(":"))
            assert params["method"] == params["tag.method"] and params["data.n_train"] > 0
            assert steps(runs, name, "test_error") == list(range(1, stop - start + 1)), name
            table = runs.Tensors(name, "seeds/text_summary")[0].tensor_proto.string_val[0].decode()
            assert table.count("\n") == 1 + stop - start, table  # header, rule, one row per seed
        else:
            lm = TINY["fluency"]["lm"]["train"]
            assert params["steps"] == lm["steps"] and params["seed"] == lm["seed"]
            assert steps(runs, name, "train_loss") == [*range(1, lm["steps"], 50), lm["steps"]]
            assert steps(runs, name, "final/validation_perplexity") == [lm["steps"]]


def job_settings(**telemetry: Any) -> dict[str, Any]:
    """The job's own settings (config `telemetry`) with these keys."""
    return family_settings("telemetry", "{}", json.dumps(telemetry))


class Killed(Exception):
    """Stands for a job killed after it logged an epoch and before it saved that epoch."""


def test_a_job_killed_and_resumed_holds_one_tracked_run_per_seed_with_every_epoch_once(
    data_path, tmp_path, monkeypatch
):
    settings = tiny(epochs=4, eval_frequency=2)
    runs = [Run("m2", 0.05, 0.0, 1.0, seed) for seed in (0, 1)]
    outs = [tmp_path / "results" / "ssvae" / f"seed~{run.seed}" / "metrics.json" for run in runs]
    folder = tmp_path / "tracking"
    on = job_settings(tracker="tensorboard", tracker_folder=str(folder))
    save = State.save

    def save_once_then_die(state: State, saved: dict[str, Any]) -> None:
        if saved["epoch"] > 1:
            raise Killed  # epoch 2 is in the tracker, the state holds epoch 1
        save(state, saved)

    with monkeypatch.context() as patched, pytest.raises(Killed):
        patched.setattr(State, "save", save_once_then_die)
        with Job("ssvae-train", outs, on):
            train(runs, data_path, settings, outs)
    with Job("ssvae-train", outs, on):
        metrics = train(runs, data_path, settings, outs)
    assert [m["timing"]["resumed_from_epoch"] for m in metrics] == [1, 1]

    tracker = tensorboard(folder)
    assert sorted(tracker.Runs()) == ["ssvae/seed~0/metrics", "ssvae/seed~1/metrics"]
    for name in tracker.Runs():
        assert len(list((folder / name).iterdir())) == 2, "both attempts wrote to the one run"
        assert steps(tracker, name, "train_loss") == [1, 2, 3, 4]
        assert steps(tracker, name, "test_accuracy") == [2, 4]


def test_switching_the_tracker_on_after_a_finished_run_plans_no_job(finished_all):
    result = snakemake(finished_all, tracker_on(TINY), "-n")
    assert NOTHING_TO_DO in result.stdout + result.stderr, result.stdout[-3000:]


@pytest.mark.workflow
def test_switching_the_tracker_off_or_moving_it_after_a_tracked_run_plans_no_job(tracked):
    for config in (TINY, tracker_on(TINY, folder="elsewhere")):
        result = snakemake(tracked, config, "-n", "--until", *TRAINING_RULES)
        assert re.search(r"^total +0$", result.stdout, re.MULTILINE), result.stdout[-3000:]


def tracking_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "tracking off" in line]


def train_two_seeds(data_path: Path, tmp_path: Path, job: dict[str, Any]) -> list[dict[str, Any]]:
    runs = [Run("m2", 0.05, 0.0, 1.0, seed) for seed in (0, 1)]
    outs = [tmp_path / "results" / "ssvae" / f"seed~{run.seed}" / "metrics.json" for run in runs]
    with Job("ssvae-train", outs, job):
        return train(runs, data_path, tiny(epochs=3, eval_frequency=1), outs)


def test_an_unwritable_tracker_folder_leaves_the_run_finished_and_says_so_once(
    data_path, tmp_path, capsys
):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    job = job_settings(tracker="tensorboard", tracker_folder=str(blocked / "tracking"))
    metrics = train_two_seeds(data_path, tmp_path, job)
    assert [len(m["curve"]) for m in metrics] == [3, 3]
    assert (tmp_path / "results" / "ssvae" / "seed~1" / "metrics.json").exists()
    (line,) = tracking_lines(capsys.readouterr().err)
    assert str(blocked) in line


def test_a_missing_tensorboard_leaves_the_run_finished_and_names_the_extra_once(
    data_path, tmp_path, capsys, monkeypatch
):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    job = job_settings(tracker="tensorboard", tracker_folder=str(tmp_path / "tracking"))
    metrics = train_two_seeds(data_path, tmp_path, job)
    assert [len(m["curve"]) for m in metrics] == [3, 3]
    (line,) = tracking_lines(capsys.readouterr().err)
    assert "pip install 'gpuflow[tracking]'" in line
    assert not (tmp_path / "tracking").exists()
