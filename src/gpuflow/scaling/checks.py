"""Checks across the scaling family's keys, run with the schema's before any job."""

from __future__ import annotations

from typing import Any

from gpuflow.errors import ConfigError
from gpuflow.scaling.layout import batch_plan


def check(scaling: dict[str, Any]) -> None:
    """Raise ConfigError on the first configuration that cannot run as `scaling` asks."""
    known = sorted(scaling["configurations"])
    missing = [name for name in scaling["run"] if name not in known]
    if missing:
        raise ConfigError(
            "scaling.run", f"{missing} not in scaling.configurations (known: {known})"
        )
    gpus = scaling["resources"]["scaling_train"]["gpu"]
    if gpus > 1:
        raise ConfigError(
            "scaling.resources.scaling_train.gpu", f"{gpus}: one GPU per process", "0 or 1"
        )
    multinode = scaling["multinode"]
    if multinode["enabled"] and not gpus:
        raise ConfigError(
            "scaling.multinode.enabled",
            "multi-node runs need GPUs",
            "scaling.resources.scaling_train.gpu: 1",
        )
    worlds = scaling["world_sizes"] + (
        [multinode["nodes"] * multinode["gpus_per_node"]] if multinode["enabled"] else []
    )
    for name in scaling["run"]:
        check_configuration(scaling, name, worlds)


def check_configuration(scaling: dict[str, Any], name: str, worlds: list[int]) -> None:
    """Raise ConfigError where configuration `name` cannot run at each of `worlds`."""
    key = f"scaling.configurations.{name}"
    settings = scaling["configurations"][name]
    model, train, data = settings["model"], settings["train"], settings["data"]
    if model["d_model"] % model["n_heads"]:
        raise ConfigError(
            f"{key}.model.d_model", f"{model['d_model']} is not divisible by n_heads "
            f"{model['n_heads']}", "a multiple of n_heads",
        )  # fmt: skip
    if scaling["warmup_epochs"] >= train["epochs"]:
        raise ConfigError(
            "scaling.warmup_epochs",
            f"{scaling['warmup_epochs']} leaves no measured epoch of {name}'s {train['epochs']}",
            f"fewer than {key}.train.epochs",
        )
    for world in worlds:
        batch_plan(train, world, f"{key}.train")
    if data["source"] != "embedded" and not data["path"]:
        raise ConfigError(f"{key}.data.path", f"required for source '{data['source']}'")
