"""Atomic outputs: a step killed at any moment leaves its output complete (old or new) or
absent, never one that looks complete and is not."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuflow.job import atomic
from gpuflow.job.atomic import atomic_path

FILES = ("config.json", "model.safetensors", "tokenizer.json")


def write_model(folder: Path, version: str) -> None:
    folder.mkdir()
    for name in FILES:
        (folder / name).write_text(version, encoding="utf-8")


def test_a_kill_while_a_folder_output_is_replaced_never_leaves_a_half_deleted_folder(
    tmp_path, monkeypatch
):
    """A model folder (fluency_train_lm's output) written again by hand: the step is killed
    while the old folder is being deleted, after one of its files is gone."""
    target = tmp_path / "lm"
    write_model(target, "old")

    def killed_after_one_file(path, *args, **kwargs):
        sorted(Path(path).iterdir())[0].unlink()
        raise SystemExit("killed")

    with monkeypatch.context() as patched, pytest.raises(SystemExit):
        patched.setattr(atomic.shutil, "rmtree", killed_after_one_file)
        with atomic_path(target) as tmp:
            write_model(tmp, "new")

    contents = {p.name: p.read_text(encoding="utf-8") for p in target.iterdir()}
    assert contents in ({name: "old" for name in FILES}, {name: "new" for name in FILES})
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(".lm.tmp-")]
    with atomic_path(target) as tmp:
        write_model(tmp, "newer")
    assert all(not p.exists() for p in leftovers), "the next writer removes what was left aside"
    assert {p.read_text(encoding="utf-8") for p in target.iterdir()} == {"newer"}
