"""MNIST from the embedded digits or from IDX files; bad data stops before training."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from gpuflow.errors import DataError
from gpuflow.ssvae.data import (
    IDX_NAMES,
    load_idx_mnist,
    load_prepared,
    prepare,
    read_idx,
    split_embedded,
)
from tests.idx_files import write_idx


@pytest.fixture(scope="module")
def embedded():
    return split_embedded(0.2, seed=0)


def test_the_embedded_split_is_stratified_seeded_and_shuffled(embedded):
    assert embedded["x_train"].shape == (4000, 28, 28) and embedded["x_test"].shape == (
        1000,
        28,
        28,
    )
    assert (np.bincount(embedded["y_test"]) == 100).all()
    assert not (np.diff(embedded["y_train"][:100]) >= 0).all()  # not sorted by label any more
    again = split_embedded(0.2, seed=0)
    assert np.array_equal(again["y_train"], embedded["y_train"])
    assert not np.array_equal(split_embedded(0.2, seed=1)["y_train"], embedded["y_train"])


def write_torchvision_layout(root, arrays, gz):
    raw = root / "MNIST" / "raw"
    for key, name in IDX_NAMES.items():
        write_idx(raw / (name + (".gz" if gz else "")), arrays[key])
    return root


@pytest.mark.parametrize("gz", [False, True])
def test_the_idx_loader_reads_back_what_was_written_in_the_torchvision_layout(
    tmp_path, embedded, gz
):
    root = write_torchvision_layout(tmp_path, embedded, gz)
    loaded = load_idx_mnist(root)
    for key in IDX_NAMES:
        assert np.array_equal(loaded[key], embedded[key])
    out = tmp_path / "mnist.npz"
    prepare("idx", str(root), 0.2, 0, out)
    assert np.array_equal(load_prepared(out)["x_test"], embedded["x_test"])


def test_a_missing_idx_file_is_named(tmp_path, embedded):
    root = write_torchvision_layout(tmp_path, embedded, gz=False)
    (root / "MNIST" / "raw" / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DataError, match="missing t10k-labels-idx1-ubyte"):
        load_idx_mnist(root)


def test_a_missing_folder_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="no such folder"):
        prepare("idx", str(tmp_path / "nowhere"), 0.2, 0, tmp_path / "out.npz")


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"\x00\x00\x08\x01\x00\x00\x00\x05\x01\x02", "data bytes"),  # cut short
        (b"\x08\x03\x00\x00", "bad magic"),
        (b"\x00\x00\x0d\x01\x00\x00\x00\x01\x00\x00\x00\x00", "data type"),
    ],
)
def test_a_malformed_idx_file_is_a_data_error_naming_the_file(tmp_path, content, words):
    path = tmp_path / "bad-idx1-ubyte"
    path.write_bytes(content)
    with pytest.raises(DataError, match=words) as raised:
        read_idx(path)
    assert str(path) in str(raised.value)


def test_a_truncated_gzip_is_a_data_error(tmp_path):
    path = tmp_path / "x.gz"
    path.write_bytes(gzip.compress(b"\x00\x00\x08\x01\x00\x00\x00\x04abcd")[:-6])
    with pytest.raises(DataError):
        read_idx(path)


def test_a_gzip_with_a_corrupt_block_is_a_data_error_naming_the_file(tmp_path):
    packed = bytearray(gzip.compress(b"\x00\x00\x08\x01\x00\x00\x00\x04abcd" * 64))
    packed[10] ^= 0xFF  # the first byte of the deflate stream: an invalid block type
    path = tmp_path / "x.gz"
    path.write_bytes(bytes(packed))
    with pytest.raises(DataError, match=r"x.gz: cannot read IDX file"):
        read_idx(path)


def test_a_split_without_images_is_refused(tmp_path, embedded):
    arrays = dict(embedded, x_test=embedded["x_test"][:0], y_test=embedded["y_test"][:0])
    root = write_torchvision_layout(tmp_path, arrays, gz=False)
    with pytest.raises(DataError, match=r"t10k-images-idx3-ubyte: no images"):
        load_idx_mnist(root)


def test_images_of_the_wrong_shape_are_refused(tmp_path, embedded):
    arrays = dict(embedded, x_test=embedded["x_test"].reshape(1000, 14, 56))
    root = write_torchvision_layout(tmp_path, arrays, gz=False)
    with pytest.raises(DataError, match="N x 28 x 28"):
        load_idx_mnist(root)


def test_the_cli_reports_a_bad_data_path_in_one_line_with_status_2(tmp_path, run_gpuflow):
    result = run_gpuflow(
        "ssvae-data",
        "--settings",
        json.dumps({"data": {"source": "idx", "path": str(tmp_path / "missing")}}),
        "--out",
        str(tmp_path / "d.npz"),
        check=False,
    )
    assert result.returncode == 2
    assert "no such folder" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "d.npz").exists()
