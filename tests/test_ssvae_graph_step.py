"""The training step replayed from static tensors (a CUDA graph on one GPU; here its CPU twin)
trains exactly as the step called directly: its warm-up leaves no trace, each call sees its
own inputs, and each output is its own."""

from __future__ import annotations

import pytest
import torch

from gpuflow.ssvae.graph_step import WARMUP_STEPS, GraphedStep


def model_and_step(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Softplus(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, fused=True, capturable=True)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = ((model(x)[:, 0] - y) ** 2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.detach()

    return model, optimizer, step


def batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [
        (torch.randn(5, 6, generator=generator), torch.randn(5, generator=generator))
        for _ in range(n)
    ]


@pytest.mark.parametrize("steps_before", [0, 2], ids=["fresh optimizer", "resumed optimizer"])
def test_replayed_steps_train_exactly_as_direct_steps(steps_before):
    data = batches(steps_before + 6)
    direct_model, _, direct_step = model_and_step()
    graphed_model, optimizer, step = model_and_step()
    for x, y in data[:steps_before]:
        direct_step(x, y)
        step(x, y)
    graphed = GraphedStep(step, list(graphed_model.parameters()), optimizer, False, "key")
    direct = [direct_step(x, y) for x, y in data[steps_before:]]
    replayed = [graphed(x, y) for x, y in data[steps_before:]]
    assert torch.equal(torch.stack(replayed), torch.stack(direct))
    for mine, theirs in zip(graphed_model.parameters(), direct_model.parameters(), strict=True):
        assert torch.equal(mine, theirs)
    assert int(optimizer.state[next(graphed_model.parameters())]["step"]) == len(data)


def test_the_warm_up_runs_its_steps_and_each_output_is_a_copy():
    model, optimizer, step = model_and_step()
    calls = []

    def counted(*inputs):
        calls.append(1)
        return step(*inputs)

    graphed = GraphedStep(counted, list(model.parameters()), optimizer, False, "key")
    outputs = [graphed(x, y) for x, y in batches(3)]
    assert len(calls) == WARMUP_STEPS + 3
    assert len({float(out) for out in outputs}) == 3
