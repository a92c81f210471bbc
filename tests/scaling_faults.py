"""Fault injection for the DDP training tests, outside the package: a NaN loss, an fp16 overflow.

`python -m tests.scaling_faults EPOCH -- <gpuflow scaling-train arguments>` runs the real step
with one weight of the model set to NaN as epoch EPOCH (1-based) starts, so that epoch's loss is
NaN on every machine. A learning rate large enough to make training diverge does so at an epoch
that depends on the CPU's kernels (measured: the same settings diverged in epoch 2 on one machine
and epoch 1 on another), so the NaN guard's tests cannot rely on one.

`python -m tests.scaling_faults overflow FIRST COUNT RANK -- <arguments>` runs the real step in
fp16 (autocast and torch.amp.GradScaler on CPU, as a GPU run with `amp: fp16` trains) and makes
the classifier's logits overflow fp16 (100000 > 65504) in optimizer steps FIRST .. FIRST+COUNT-1
(1-based, counted over the run) on rank RANK only (-1: every rank), as a real overflow would.
"""

from __future__ import annotations

import sys
from typing import Any

OVERFLOWING_LOGIT = 1e5  # fp16's largest finite value is 65504


def poison_weights(poisoned_epoch: int) -> None:
    """Set one weight to NaN as epoch `poisoned_epoch` starts."""
    import torch

    from gpuflow.scaling.train import Trainer

    train_epoch = Trainer.train_epoch

    def poisoned(self: Trainer, epoch: int, first_step: bool) -> dict[str, Any]:
        if epoch + 1 == poisoned_epoch:
            with torch.no_grad():
                next(self.model.parameters()).view(-1)[0] = float("nan")
        return train_epoch(self, epoch, first_step)

    Trainer.train_epoch = poisoned  # type: ignore[method-assign]


def overflow(first: int, count: int, rank: int) -> None:
    """Train in fp16 and overflow the logits of steps first .. first+count-1 on `rank`."""
    import torch

    from gpuflow.scaling import train

    train.precision_for = lambda device, amp: "fp16"
    forward_backward, optimizer_step = train.Trainer.forward_backward, train.Trainer.optimizer_step
    steps_done = 0

    def counted_step(self: train.Trainer) -> bool:
        nonlocal steps_done
        steps_done += 1
        return optimizer_step(self)

    def overflow_logits(module: torch.nn.Module, inputs: Any, logits: torch.Tensor) -> Any:
        assert logits.dtype == torch.float16, "the fault needs an fp16 forward pass"
        return logits * 0 + OVERFLOWING_LOGIT

    def faulty(self: train.Trainer, batch: dict[str, Any], divisor: int = 1) -> torch.Tensor:
        if first <= steps_done + 1 < first + count and rank in (-1, self.ctx.rank):
            handle = self.model.head.register_forward_hook(overflow_logits)
            try:
                return forward_backward(self, batch, divisor)
            finally:
                handle.remove()
        return forward_backward(self, batch, divisor)

    train.Trainer.optimizer_step = counted_step  # type: ignore[method-assign]
    train.Trainer.forward_backward = faulty  # type: ignore[method-assign]


def main(argv: list[str]) -> int:
    """Run `gpuflow scaling-train` (argv after `--`) with the fault argv names."""
    from gpuflow import cli

    fault, args = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    if fault[0] == "overflow":
        overflow(*(int(value) for value in fault[1:4]))
    else:
        poison_weights(int(fault[0]))
    return cli.main(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
