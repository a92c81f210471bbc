"""fp16 mixed precision never stops a healthy run: skipped steps are counted and left out.

The runs train in fp16 on CPU (autocast and torch.amp.GradScaler("cpu"), as `amp: fp16` trains
on a GPU) through tests/scaling_faults.py, which also makes chosen steps' logits overflow fp16.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuflow.job.divergence import SkippedSteps
from gpuflow.job.paths import STATE, job_file
from tests.conftest import REPO, workflow_env
from tests.test_scaling_ddp import settings, train_command

ADVICE = " (lower the learning rate or check the data)"


def test_every_skipped_step_is_counted_but_only_a_run_of_them_at_the_scale_floor_diverges():
    skipped = SkippedSteps(limit=2)
    for scale, skip in ((65536.0, True), (32768.0, False), (2.0, True), (1.0, True)):
        skipped.observe(skip, scale)
    assert (skipped.total, skipped.at_floor, skipped.diverged) == (3, 1, False)
    skipped.observe(False, 0.5)  # an applied step ends the run of skips
    assert (skipped.total, skipped.at_floor) == (3, 0)
    skipped.observe(True, 1.0)
    skipped.observe(True, 0.5)
    assert (skipped.total, skipped.at_floor, skipped.diverged) == (5, 2, True)


def faulted_run(
    data: Path, out: Path, config: dict[str, Any], world: int, fault: list[str]
) -> subprocess.CompletedProcess[str]:
    """`scaling-train` through tests/scaling_faults.py with `fault` (see there)."""
    command = train_command(data, out, config, world)
    if world == 1:
        command = [sys.executable, "-m", "tests.scaling_faults", *fault, "--", *command[1:]]
    else:
        at = command.index("gpuflow")
        command[at : at + 1] = ["tests.scaling_faults", *fault, "--"]
    return subprocess.run(
        command, capture_output=True, text=True, env=workflow_env(), cwd=REPO, timeout=300
    )


@pytest.mark.parametrize(
    ("world", "accumulation", "rank", "fused"),
    [(1, 1, -1, "never"), (2, 2, 1, "never"), (1, 1, -1, "always")],
    ids=["one-process", "ddp-rank-1", "fused-adamw"],
)
def test_one_overflowing_fp16_step_is_skipped_counted_kept_out_of_the_loss_and_the_run_goes_on(
    scaling_data: Path, tmp_path: Path, world: int, accumulation: int, rank: int, fused: str
):
    # 96 texts in global batches of 16: 6 optimizer steps an epoch; step 3 overflows. Fused
    # AdamW takes the scaler's inf check into its kernel (no host check): the same outcome.
    config = {**settings(epochs=2, accumulation_steps=accumulation), "fused_adamw": fused}
    result = faulted_run(scaling_data, tmp_path, config, world, ["overflow", "3", "1", str(rank)])
    assert result.returncode == 0, result.stderr[-3000:]

    run = json.loads((tmp_path / "run.json").read_text())
    assert run["precision"] == "fp16" and run["world_size"] == world
    assert run["fused_adamw"] is (fused == "always")
    assert run["skipped_steps"] == 1
    assert [e["skipped_steps"] for e in run["epochs"]] == [1, 0]
    # The scaler halved its scale once (65536 -> 32768) and never grew it back (2000 steps).
    assert [e["loss_scale"] for e in run["epochs"]] == [32768.0, 32768.0]
    assert all(math.isfinite(e["train_loss"]) for e in run["epochs"])
    # Under DDP the overflow happened on one rank only; the gradients are all-reduced before the
    # scaler looks at them, so every rank skipped the same step.
    assert [r["skipped_steps"] for r in run["ranks"]] == [1] * world


def test_an_fp16_run_whose_every_step_overflows_stops_at_the_scale_floor_with_one_line(
    scaling_data: Path, tmp_path: Path
):
    data = scaling_data  # 96 training texts
    config = {**settings(epochs=3, global_batch_size=8), "amp_overflow_limit": 2}
    out = tmp_path / "run"
    # 12 steps an epoch; from step 3 on every step overflows: steps 3..18 halve the scale from
    # 65536 to 1, steps 19 and 20 are skipped at the floor (1, then 0.5): step 20, in epoch 2.
    result = faulted_run(data, out, config, 1, ["overflow", "3", "1000", "-1"])
    state = job_file(out / "run.json", STATE)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "gpuflow scaling-train: error: run tiny world=1: 2 optimizer steps in a row overflowed"
        " with the fp16 loss scale at its floor (1) in epoch 2; training stopped, the last good"
        f" state (after epoch 1) is kept in {state}" + ADVICE
    )
    assert "Traceback" not in result.stderr
    assert not (out / "run.json").exists()
