"""Stacked training: each run is itself, resumes exactly, and batches the same from any source."""

from __future__ import annotations

import copy
import json
from typing import Any

import numpy as np
import pytest
import torch

from gpuflow.job.context import current
from gpuflow.job.paths import STATE, job_file
from gpuflow.job.state import State
from gpuflow.settings.blocks import split_json
from gpuflow.settings.validate import merge_config
from gpuflow.ssvae.batches import epoch_indices
from gpuflow.ssvae.data import split_embedded
from gpuflow.ssvae.model import StackedM2
from gpuflow.ssvae.train import (
    Run,
    StackTrainer,
    resume_state,
    train,
    train_settings,
    training_results,
)
from tests.conftest import BIN

TINY_CHANGES = {
    "model": {"hidden": 32, "latent": 4},
    "train": {
        "batch_size": 50,
        "labelled_batch_size": 20,
        "learning_rate": 1e-3,
        "eval_batch_size": 250,
    },
}
TINY = merge_config(train_settings(), copy.deepcopy(TINY_CHANGES))


def tiny(**train: Any) -> dict[str, Any]:
    """TINY's settings with these `ssvae.train` keys changed."""
    return merge_config(copy.deepcopy(TINY), {"train": train})


CPU = [torch.device("cpu")]


@pytest.fixture(scope="module")
def data_path(tmp_path_factory):
    """A quarter of the embedded training digits and a fifth of its test digits: fast runs."""
    arrays = split_embedded(0.2, seed=0)
    small = {
        "x_train": arrays["x_train"][:1000],
        "y_train": arrays["y_train"][:1000],
        "x_test": arrays["x_test"][:200],
        "y_test": arrays["y_test"][:200],
    }
    path = tmp_path_factory.mktemp("ssvae") / "mnist.npz"
    np.savez(path, **small)
    return path


@pytest.fixture(scope="module")
def data(data_path):
    with np.load(data_path) as handle:
        return {key: handle[key] for key in handle.files}


def take_steps(trainer: StackTrainer, n: int) -> None:
    indices = epoch_indices(trainer.index, trainer.plan, trainer.order_rng, unlabelled=trainer.m2)
    batches = trainer.batches.epoch(indices, trainer.plan)
    for _ in range(n):
        trainer.train_step(next(batches))


@pytest.mark.parametrize("kind", ["m2", "baseline"])
def test_a_stacked_runs_kth_member_matches_the_same_run_trained_alone(data, kind):
    torch.set_num_threads(1)
    settings = TINY
    runs = [
        Run(kind, 0.05, 0.2, 1.0 if kind == "m2" else None, 0),
        Run(kind, 0.05, 0.2, 10.0 if kind == "m2" else None, 7),
        Run(kind, 0.05, 0.2, 3.0 if kind == "m2" else None, 2),
    ]
    stacked = StackTrainer(runs, data, settings, CPU)
    alone = StackTrainer([runs[1]], data, settings, CPU)
    take_steps(stacked, 6)
    take_steps(alone, 6)
    for (name, p), (_, q) in zip(
        stacked.model.named_parameters(), alone.model.named_parameters(), strict=True
    ):
        # Adam's first steps are about lr * sign(grad): float rounding of near-zero gradients
        # (batched vs single matmuls) moves a weight by far less than 1% of one step.
        assert (p[1] - q[0]).abs().max() < 0.01 * TINY["train"]["learning_rate"], name
        assert not torch.allclose(p[0], q[0]), name  # other members really are other runs
    exp_avg = [s["exp_avg"] for s in stacked.optimizer.state.values()]
    exp_avg_alone = [s["exp_avg"] for s in alone.optimizer.state.values()]
    for m, m_alone in zip(exp_avg, exp_avg_alone, strict=True):
        assert torch.allclose(m[1], m_alone[0], rtol=1e-4, atol=1e-6)


def test_label_share_weighs_each_runs_labelled_bound_by_its_labelled_over_unlabelled_digits(
    data,
):
    runs = [Run("m2", 0.05, 0.0, 1.0, 0), Run("m2", 0.05, 0.0, 1.0, 1)]
    shared = StackTrainer(runs, data, tiny(labelled_bound_weight="label_share"), CPU)
    equal = StackTrainer(runs, data, TINY, CPU)
    n_labelled, n_unlabelled = 50, 950  # 5% of the 1,000 training digits
    assert shared.model.bound_weight.flatten().tolist() == pytest.approx(
        [n_labelled / n_unlabelled] * 2
    )
    assert equal.model.bound_weight.flatten().tolist() == [1.0, 1.0]


def test_a_state_saved_by_an_unfused_adam_resumes_under_the_fused_one(data):
    run = [Run("m2", 0.05, 0.2, 1.0, 0)]
    saved = StackTrainer(run, data, TINY, CPU)
    take_steps(saved, 2)
    state = saved.state()
    for group in state["optimizer"]["param_groups"]:
        group["fused"] = None  # as an Adam without the fused kernel saves it
    resumed = StackTrainer(run, data, TINY, CPU)
    resumed.load_state(state)
    assert all(group["fused"] for group in resumed.optimizer.param_groups)


def test_one_adam_over_stacked_parameters_equals_one_adam_per_run():
    generator = torch.Generator().manual_seed(0)
    stacked = torch.nn.Parameter(torch.randn(3, 5, 4, generator=generator))
    apart = [torch.nn.Parameter(stacked.detach()[r].clone()) for r in range(3)]
    one = torch.optim.Adam([stacked], lr=0.01)
    each = [torch.optim.Adam([p], lr=0.01) for p in apart]
    for _ in range(5):
        grads = torch.randn(3, 5, 4, generator=generator)
        stacked.grad = grads.clone()
        one.step()
        for r, (p, opt) in enumerate(zip(apart, each, strict=True)):
            p.grad = grads[r].clone()
            opt.step()
    for r in range(3):
        assert torch.allclose(stacked.detach()[r], apart[r].detach(), rtol=0, atol=1e-7)


def test_a_batch_split_in_two_gives_the_same_per_example_losses_as_dataparallel_needs():
    torch.manual_seed(0)
    model = StackedM2(2, 16, 3, torch.tensor([1.0, 5.0]))
    model.reset([torch.Generator().manual_seed(s) for s in (0, 1)])
    x_l, x_u = torch.rand(2, 6, 784), torch.rand(2, 8, 784)
    y_l = torch.randint(0, 10, (2, 6))
    eps_l, eps_u = torch.randn(2, 6, 3), torch.randn(2, 8, 10, 3)
    whole = model(x_l, y_l, x_u, eps_l, eps_u)
    halves = [
        model(x_l[:, s], y_l[:, s], x_u[:, t], eps_l[:, s], eps_u[:, t])
        for s, t in ((slice(0, 3), slice(0, 4)), (slice(3, 6), slice(4, 8)))
    ]
    for key in whole:
        joined = torch.cat([h[key] for h in halves], dim=1)
        assert torch.allclose(whole[key], joined, rtol=1e-5, atol=1e-5), key


def test_the_unlabelled_bound_sums_the_labelled_bound_over_classes_plus_entropy():
    model = StackedM2(1, 16, 3, torch.tensor([1.0]))
    model.reset([torch.Generator().manual_seed(0)])
    x, eps = torch.rand(1, 4, 784), torch.randn(1, 4, 10, 3)
    with torch.no_grad():
        unlabelled = model.unlabelled_terms(x, eps)
        q = unlabelled["log_q"].exp()
        by_class = torch.stack(
            [
                model.labelled_terms(x, torch.full((1, 4), k), eps[:, :, k])["neg_elbo"]
                for k in range(10)
            ],
            dim=-1,
        )
        entropy = -(q * unlabelled["log_q"]).sum(-1)
        expected = (q * by_class).sum(-1) - entropy
    assert torch.allclose(unlabelled["neg_bound"], expected, rtol=1e-5, atol=1e-4)


def test_a_dataloader_with_workers_gives_the_numbers_of_device_resident_data(data_path, tmp_path):
    settings = tiny(epochs=2, eval_frequency=1)
    runs = [Run("m2", 0.05, 0.0, 1.0, s) for s in (0, 1)]
    resident = train(runs, data_path, settings, [tmp_path / "a0.json", tmp_path / "a1.json"])
    loaded = train(
        runs,
        data_path,
        {
            **settings,
            "data_on_device": False,
            "num_workers": 1,
            "persistent_workers": True,
            "pin_memory": True,
        },
        [tmp_path / "b0.json", tmp_path / "b1.json"],
    )
    for a, b in zip(resident, loaded, strict=True):
        assert a["curve"] == b["curve"]


def test_eval_frequency_evaluates_every_kth_epoch_and_always_the_last(data_path, tmp_path):
    settings = tiny(epochs=5, eval_frequency=2, batch_size=200)
    (metrics,) = train(
        [Run("baseline", 0.05, 0.0, None, 0)],
        data_path,
        settings,
        [tmp_path / "m.json"],
    )
    evaluated = [row["epoch"] for row in metrics["curve"] if "test_accuracy" in row]
    assert evaluated == [2, 4, 5]
    assert metrics["test_accuracy"] == metrics["curve"][-1]["test_accuracy"]
    assert not (tmp_path / "s.pt").exists()  # the state goes once the metrics are written


def step_arguments(settings: dict) -> list[str]:
    """The model and train blocks of `settings` as `gpuflow ssvae-train`'s --settings and
    --runtime JSON."""
    nested = {block: settings[block] for block in ("model", "train")}
    return [
        "--settings",
        split_json("ssvae", nested, "results"),
        "--runtime",
        split_json("ssvae", nested, "runtime"),
    ]


def train_command(data_path, out_dir, epochs):
    settings = tiny(epochs=epochs, eval_frequency=2)
    return [
        str(BIN / "gpuflow"),
        "ssvae-train",
        "--data",
        str(data_path),
        "--frac",
        "0.05",
        "--corrupt",
        "0.1",
        "--alpha",
        "3",
        "--seeds",
        "4",
        "9",
        "--threads",
        "1",
        *step_arguments(settings),
        "--out",
        str(out_dir / "seed~4.json"),
        str(out_dir / "seed~9.json"),
    ]


def comparable(path):
    metrics = json.loads(path.read_text())
    metrics.pop("timing")
    metrics.pop("run_record")
    return metrics


def test_a_state_from_other_settings_is_not_resumed(data_path, tmp_path):
    settings = tiny(epochs=1)
    trainer = StackTrainer(
        [Run("baseline", 0.05, 0.0, None, 0)],
        dict(np.load(data_path)),
        settings,
        CPU,
    )
    trainer.epoch = 1
    State(tmp_path / "m.json", "another fingerprint").save(trainer.state())
    (metrics,) = train(
        [Run("baseline", 0.05, 0.0, None, 0)], data_path, settings, [tmp_path / "m.json"]
    )
    assert metrics["timing"]["resumed_from_epoch"] is None


def test_a_state_saved_on_another_device_type_is_not_resumed(data_path, tmp_path):
    """CPU and CUDA generators draw different noise, and their states do not load into each
    other: a state the same job saved on a GPU is left alone on the CPU; one saved on the CPU
    is taken up."""
    runs = [Run("m2", 0.05, 0.0, 1.0, 0)]
    settings = tiny(epochs=1)
    out = tmp_path / "m.json"
    fresh = StackTrainer(runs, dict(np.load(data_path)), settings, CPU).state()  # at epoch 0
    for device_type, resumed_from in (("cuda", None), ("cpu", 0)):
        resume_state(current([out]), runs, settings, data_path, device_type).save(fresh)
        (metrics,) = train(runs, data_path, settings, [out])
        assert metrics["timing"]["resumed_from_epoch"] == resumed_from, device_type


class Interrupted(Exception):
    """Stands for a job killed right after its first checkpoint."""


def interrupt_after_first_checkpoint(monkeypatch, runs, data_path, settings, out) -> None:
    """Train until the first state is on disk, then stop, as a killed job would."""
    write_state = State.save

    def save_then_stop(state, saved):
        write_state(state, saved)
        raise Interrupted

    with monkeypatch.context() as patched:
        patched.setattr(State, "save", save_then_stop)
        with pytest.raises(Interrupted):
            train(runs, data_path, settings, [out])
    assert job_file(out, STATE).exists()


def test_a_state_resumes_under_other_runtime_settings_to_the_same_metrics(
    data_path, tmp_path, monkeypatch
):
    settings = tiny(epochs=2, eval_frequency=1)
    runs = [Run("m2", 0.05, 0.0, 1.0, 0)]
    (whole,) = train(runs, data_path, settings, [tmp_path / "whole.json"])
    out = tmp_path / "r.json"
    interrupt_after_first_checkpoint(monkeypatch, runs, data_path, settings, out)
    # ssvae.train keys, where `--runtime` nests them and the training reads them
    other = tiny(
        epochs=2, eval_frequency=1, eval_batch_size=64, data_on_device=False, num_workers=1
    )
    assert other != settings and training_results(other) == training_results(settings)
    (resumed,) = train(runs, data_path, other, [out])
    assert resumed["timing"]["resumed_from_epoch"] == 1
    assert resumed["test_accuracy"] == whole["test_accuracy"]
    for ours, theirs in zip(resumed["curve"], whole["curve"], strict=True):
        assert ours == pytest.approx(theirs, rel=1e-5)  # eval batches only reorder float sums


def test_a_state_written_for_another_data_split_is_not_resumed(tmp_path, monkeypatch):
    """Same shapes, other digits (ssvae.data.split_seed 0 vs 1): the state must not be used."""
    paths = []
    for split_seed in (0, 1):
        arrays = split_embedded(0.2, seed=split_seed)
        path = tmp_path / f"split{split_seed}.npz"
        np.savez(path, **{k: v[:500] for k, v in arrays.items()})
        paths.append(path)
    settings = tiny(epochs=2)
    runs = [Run("baseline", 0.05, 0.0, None, 0)]
    out = tmp_path / "m.json"
    interrupt_after_first_checkpoint(monkeypatch, runs, paths[0], settings, out)
    (metrics,) = train(runs, paths[1], settings, [out])
    assert metrics["timing"]["resumed_from_epoch"] is None
