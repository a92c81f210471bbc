"""What a scoring step's resume state is fingerprinted by: its texts and its model."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def texts_digest(text_ids: Sequence[Any], texts: Sequence[str]) -> str:
    """A hash of the texts and their ids, in order."""
    text = json.dumps([[str(i) for i in text_ids], list(texts)], ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def model_identity(reference: str) -> list[Any]:
    """A model folder's files (name, size, modification time), or the model id as given."""
    folder = Path(reference)
    if not folder.is_dir():
        return [reference]
    files = sorted(p for p in folder.iterdir() if p.is_file())
    return [reference, *[[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]]
