"""Find a Hugging Face model on this machine, without downloading and without importing torch."""

from __future__ import annotations

import os
from pathlib import Path

from gpuflow.errors import ConfigError


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache folder this process would read."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    hf_home = os.environ.get("HF_HOME", str(Path.home() / ".cache" / "huggingface"))
    return Path(hf_home) / "hub"


def cached_snapshot(model_id: str) -> Path | None:
    """The newest cached snapshot folder of `model_id` that holds a config.json, if any."""
    folder = hf_cache_dir() / ("models--" + model_id.replace("/", "--")) / "snapshots"
    if not folder.is_dir():
        return None
    snapshots = [s for s in folder.iterdir() if (s / "config.json").is_file()]
    return max(snapshots, key=lambda s: s.stat().st_mtime) if snapshots else None


def check_model_reference(key: str, reference: str) -> str:
    """Return `reference` if it names a local model folder or a cached model id, else raise."""
    path = Path(reference).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise ConfigError(
                key, f"{reference!r} has no config.json", "a Hugging Face model folder"
            )
        return reference
    if cached_snapshot(reference) is not None:
        return reference
    raise ConfigError(
        key,
        f"{reference!r} is neither a local model folder nor a model id in the cache "
        f"{hf_cache_dir()} (nothing is downloaded)",
        "a folder saved with save_pretrained, or a model id cached beforehand",
    )
