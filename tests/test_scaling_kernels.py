"""Runtime kernel choices: fused AdamW (from the device, or forced) and TF32 on GPUs only."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from gpuflow.job.state import load_optimizer_state
from gpuflow.scaling.kernels import adamw, padded_length_multiple, set_tf32, use_fused_adamw
from gpuflow.scaling.train import collate
from tests.test_scaling_ddp import settings, train, weights

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


def test_auto_fuses_adamw_on_gpus_only_and_the_choice_can_be_forced_either_way():
    assert [use_fused_adamw("auto", d) for d in (CPU, CUDA)] == [False, True]
    assert [use_fused_adamw("always", d) for d in (CPU, CUDA)] == [True, True]
    assert [use_fused_adamw("never", d) for d in (CPU, CUDA)] == [False, False]


def one_step(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> None:
    model(torch.ones(2, 3)).square().sum().backward()
    optimizer.step()
    optimizer.zero_grad()


def test_a_state_saved_unfused_resumes_fused_and_steps_like_the_unfused_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 3)
    plain = adamw(model.parameters(), fused=False, lr=0.1)
    one_step(plain, model)
    saved = copy.deepcopy(plain.state_dict())

    twin = copy.deepcopy(model)
    fused = adamw(model.parameters(), fused=True, lr=0.1)
    unfused = adamw(twin.parameters(), fused=False, lr=0.1)
    load_optimizer_state(fused, copy.deepcopy(saved))
    load_optimizer_state(unfused, copy.deepcopy(saved))
    # torch alone would take the saved group's flag (None) and quietly run unfused.
    assert fused.param_groups[0]["fused"] is True
    assert unfused.param_groups[0]["fused"] is None
    one_step(fused, model)
    one_step(unfused, twin)
    torch.testing.assert_close(model.weight, twin.weight)
    assert fused.state[model.weight]["step"].item() == 2


def test_tf32_is_never_switched_on_for_a_cpu_run():
    before = torch.backends.cuda.matmul.fp32_precision
    assert set_tf32(True, CPU) is False
    assert torch.backends.cuda.matmul.fp32_precision == before


def test_tf32_is_switched_on_for_a_gpu_run_only_when_asked():
    """The CUDA path on CPU: torch keeps the flag for CUDA matmuls without a GPU present."""
    before = torch.backends.cuda.matmul.fp32_precision
    try:
        assert set_tf32(False, CUDA) is False
        assert torch.backends.cuda.matmul.fp32_precision == before
        assert set_tf32(True, CUDA) is True
        assert torch.backends.cuda.matmul.fp32_precision == "tf32"
    finally:
        torch.backends.cuda.matmul.fp32_precision = before


def test_a_run_with_fused_adamw_records_it_and_trains_to_the_numbers_of_the_default(
    scaling_data: Path, tmp_path: Path
):
    default = train(scaling_data, tmp_path / "default", settings(), world=1)
    config = {**settings(), "fused_adamw": "always", "tf32": True}
    fused = train(scaling_data, tmp_path / "fused", config, world=1)
    assert (default["fused_adamw"], fused["fused_adamw"]) == (False, True)
    assert (default["tf32"], fused["tf32"]) == (False, False)  # a CPU run
    assert default["padded_length_multiple"] == 1
    for a, b in zip(default["epochs"], fused["epochs"], strict=True):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-5)
    reference, other = (
        weights(tmp_path / "default" / "model.pt"),
        weights(tmp_path / "fused" / "model.pt"),
    )
    for name, value in reference.items():
        torch.testing.assert_close(other[name], value, rtol=0, atol=1e-5, msg=name)
    assert json.loads((tmp_path / "fused" / "run.json").read_text())["fused_adamw"] is True


@pytest.mark.parametrize(
    "device, precision, multiple",
    [(CUDA, "bf16", 64), (CUDA, "fp16", 64), (CUDA, "fp32", 1), (CPU, "fp32", 1)],
)
def test_only_half_precision_batches_on_a_gpu_are_padded_to_a_multiple_of_64(
    device, precision, multiple
):
    """cuDNN attention (bf16/fp16 on CUDA) builds a graph per sequence length: a handful of
    lengths, not one per batch. Elsewhere a batch stays as long as its longest text."""
    texts = [(np.arange(1, 4), 0), (np.arange(1, 71), 1)]
    batch = collate(texts, padded_length_multiple(device, precision), max_length=512)
    assert batch["ids"].shape == (2, 128 if multiple == 64 else 70)
    assert batch["mask"].sum().item() == batch["tokens"] == 73
    assert batch["ids"][:, 70:].eq(0).all()


def test_a_padded_length_never_passes_the_model_s_positions():
    texts = [(np.arange(1, 71), 1)]
    multiple = padded_length_multiple(CUDA, "bf16")
    assert collate(texts, multiple, max_length=100)["ids"].shape == (1, 100)
