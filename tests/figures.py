"""What a figure test checks: a real image of a real size with something drawn on it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib import image


def assert_drawn_figure(path: Path, min_width: int = 300, min_height: int = 200) -> None:
    """`path` is a PNG of at least min_width x min_height pixels, not blank nor one colour."""
    pixels = image.imread(path)[..., :3]
    height, width = pixels.shape[:2]
    assert width >= min_width and height >= min_height, f"{path}: {width}x{height} pixels"
    background = pixels[0, 0]
    drawn = np.any(np.abs(pixels - background) > 0.1, axis=-1).mean()
    assert drawn > 0.01, f"{path}: only {drawn:.2%} of the pixels differ from the background"
    colours = np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 8, f"{path}: {len(colours)} colours"
