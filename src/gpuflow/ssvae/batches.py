"""Mini-batches for R stacked runs: per-run shuffles, then index batching or a DataLoader."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset


@dataclass
class RunIndex:
    """Indices of the stacked runs: labelled [R, n_l] with labels, unlabelled [R, n_u]."""

    labelled: torch.Tensor
    labels: torch.Tensor
    unlabelled: torch.Tensor


@dataclass
class Plan:
    """Batch sizes and steps per epoch (the unlabelled set sets the epoch; last partial dropped)."""

    steps: int
    labelled_batch: int
    unlabelled_batch: int


def make_plan(
    n_labelled: int, n_unlabelled: int, batch_size: int, labelled_batch_size: int
) -> Plan:
    unlabelled_batch = min(batch_size, n_unlabelled)
    return Plan(
        steps=max(1, n_unlabelled // unlabelled_batch),
        labelled_batch=min(labelled_batch_size, n_labelled),
        unlabelled_batch=unlabelled_batch,
    )


def _orders(n: int, rows: int, generators: list[torch.Generator]) -> torch.Tensor:
    """[R, rows * n]: `rows` fresh permutations of range(n) per run, from each run's generator."""
    return torch.stack(
        [torch.rand(rows, n, generator=g).argsort(dim=1).flatten() for g in generators]
    )


def epoch_indices(
    index: RunIndex, plan: Plan, generators: list[torch.Generator], unlabelled: bool
) -> dict[str, torch.Tensor]:
    """One epoch's training indices per run: labelled [R, steps*Bl], unlabelled [R, steps*Bu]."""
    n_l = index.labelled.shape[1]
    need = plan.steps * plan.labelled_batch
    positions = _orders(n_l, -(-need // n_l), generators)[:, :need]
    out = {
        "labelled": index.labelled.gather(1, positions),
        "labels": index.labels.gather(1, positions),
    }
    if unlabelled:
        n_u = index.unlabelled.shape[1]
        order = _orders(n_u, 1, generators)[:, : plan.steps * plan.unlabelled_batch]
        out["unlabelled"] = index.unlabelled.gather(1, order)
    return out


def _step(indices: dict[str, torch.Tensor], plan: Plan, step: int) -> dict[str, torch.Tensor]:
    """One step's slice of each run's epoch indices."""
    bl, bu = plan.labelled_batch, plan.unlabelled_batch
    sizes = {"labelled": bl, "labels": bl, "unlabelled": bu}
    return {k: v[:, step * sizes[k] : (step + 1) * sizes[k]] for k, v in indices.items()}


def _gather(images: torch.Tensor, step: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    batch = {"x_l": images[step["labelled"]], "y_l": step["labels"]}
    if "unlabelled" in step:
        batch["x_u"] = images[step["unlabelled"]]
    return batch


class _StepDataset(Dataset):
    """Host-side batches: the key is one step's index tensors (the sampler runs in the parent)."""

    def __init__(self, images: torch.Tensor):
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, step: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:  # type: ignore[override]
        return _gather(self.images, step)


class Batches:
    """Yields each epoch's batches on `device`, from device-resident data or a DataLoader."""

    def __init__(self, images: torch.Tensor, device: torch.device, train: dict[str, Any]):
        self.device = device
        self.on_device = train["data_on_device"]
        if self.on_device:
            self.images = images.to(device)
            self.loader_options = {}
        else:
            self.images = images
            workers = train["num_workers"]
            self.loader_options = {
                "num_workers": workers,
                "pin_memory": train["pin_memory"] and device.type == "cuda",
                "persistent_workers": train["persistent_workers"] and workers > 0,
            }
        self._loader: DataLoader | None = None
        # The DataLoader's sampler: the current epoch's step keys, replaced in place each epoch.
        self._steps: list[dict[str, torch.Tensor]] = []

    def epoch(
        self, indices: dict[str, torch.Tensor], plan: Plan
    ) -> Iterator[dict[str, torch.Tensor]]:
        """Batches of one epoch, in order."""
        if self.on_device:
            on_device = {k: v.to(self.device) for k, v in indices.items()}
            for step in range(plan.steps):
                yield _gather(self.images, _step(on_device, plan, step))
            return
        self._steps[:] = [_step(indices, plan, step) for step in range(plan.steps)]
        if self._loader is None:
            self._loader = DataLoader(
                _StepDataset(self.images),
                batch_size=None,
                sampler=self._steps,
                **self.loader_options,
            )
        for batch in self._loader:
            yield {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
