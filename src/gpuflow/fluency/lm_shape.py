"""The embedded LM's shape check, light enough for the workflow to run while it is read."""

from __future__ import annotations

from typing import Any

from gpuflow.errors import ConfigError


def check_heads(train: dict[str, Any]) -> None:
    """`fluency.lm.train.n_head` divides `n_embd` (each head gets an equal slice)."""
    if train["n_embd"] % train["n_head"]:
        raise ConfigError(
            "fluency.lm.train.n_head",
            f"{train['n_head']} does not divide n_embd={train['n_embd']}",
        )
