"""Fault injection for the DDP training tests, outside the package: a loss that really turns NaN.

`python -m tests.scaling_faults EPOCH -- <gpuflow scaling-train arguments>` runs the real step
with one weight of the model set to NaN as epoch EPOCH (1-based) starts, so that epoch's loss is
NaN on every machine. A learning rate large enough to make training diverge does so at an epoch
that depends on the CPU's kernels (measured: the same settings diverged in epoch 2 on one machine
and epoch 1 on another), so the NaN guard's tests cannot rely on one.
"""

from __future__ import annotations

import sys
from typing import Any


def main(argv: list[str]) -> int:
    """Run `gpuflow scaling-train` (argv after `--`) with the weights poisoned at epoch argv[0]."""
    import torch

    from gpuflow import cli
    from gpuflow.scaling.train import Trainer

    poisoned_epoch, args = int(argv[0]), argv[argv.index("--") + 1 :]
    train_epoch = Trainer.train_epoch

    def poisoned(self: Trainer, epoch: int, first_step: bool) -> dict[str, Any]:
        if epoch + 1 == poisoned_epoch:
            with torch.no_grad():
                next(self.model.parameters()).view(-1)[0] = float("nan")
        return train_epoch(self, epoch, first_step)

    Trainer.train_epoch = poisoned  # type: ignore[method-assign]
    return cli.main(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
