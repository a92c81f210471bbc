"""Output folders that cannot take the output: full, read-only, or a path through a file.

Tests run as root, where `chmod` stops nothing, so the folders are ones root cannot write either:
a tiny tmpfs (full after 64 KiB), a read-only tmpfs, and a path whose parent is a regular file.
Mounting needs root with CAP_SYS_ADMIN; where that is missing those cases are skipped, except
under CI (the `CI` variable set), where a skip would hide them: there they fail.
The step must stop with one line naming the output and the problem, and leave nothing behind.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from gpuflow.cli import main as gpuflow_main
from gpuflow.errors import DataError
from gpuflow.job.state import State
from tests.conftest import snakemake, tiny_config


@pytest.fixture
def mounted(tmp_path) -> Iterator[Callable[[str], Path]]:
    """mount(options) -> a fresh tmpfs folder mounted with those options, unmounted afterwards."""
    points: list[Path] = []

    def mount(options: str) -> Path:
        point = tmp_path / f"mnt{len(points)}"
        point.mkdir()
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            reason = f"cannot mount a tmpfs here: {result.stderr.strip()}"
            if os.environ.get("CI"):
                pytest.fail(
                    f"{reason} (CI must run the full-disk and read-only cases: run as root)"
                )
            pytest.skip(reason)
        points.append(point)
        return point

    yield mount
    gc.collect()  # a failed write's traceback can hold the last file on the mount open
    for point in reversed(points):
        subprocess.run(["umount", str(point)], check=True)


def write_texts(out: Path, capsys) -> str:
    """The texts step with ~200 KB of reviews to write; returns its stderr."""
    texts = {"n_texts": 100, "corpus": ["imdb"], "max_words": 400, "shuffled_twins": True}
    argv = ["fluency-texts", "--settings", json.dumps({"texts": texts}), "--out", str(out)]
    capsys.readouterr()
    assert gpuflow_main(argv) == 2
    return capsys.readouterr().err.strip()


def test_a_full_disk_is_one_line_naming_the_output_and_leaves_nothing(mounted, capsys):
    folder = mounted("size=64k")
    out = folder / "fluency" / "texts.csv"
    err = write_texts(out, capsys)
    assert err == (
        f"gpuflow fluency-texts: error: {out}: cannot write the output (No space left on device)"
        " (expected a writable output folder with free space)"
    )
    written = [p for p in folder.rglob("*") if p.is_file()]
    # no output; only the failed job's record (gpuflow.job.record), where it still fits
    assert all("jobs" in p.relative_to(folder).parts for p in written), written


def test_a_read_only_folder_is_one_line_naming_the_output(mounted, capsys):
    out = mounted("ro,size=64k") / "texts.csv"
    err = write_texts(out, capsys)
    assert f"{out}: cannot write the output (Read-only file system)" in err
    assert len(err.splitlines()) == 1


def test_an_output_path_through_a_regular_file_is_one_line_naming_it(tmp_path, capsys):
    (tmp_path / "results").write_text("a file where a folder should be\n")
    out = tmp_path / "results" / "fluency" / "texts.csv"
    err = write_texts(out, capsys)
    assert f"{out}: cannot write the output (a part of its folder path is a file" in err
    assert (tmp_path / "results").read_text() == "a file where a folder should be\n"


@pytest.mark.workflow
def test_a_workflow_whose_results_folder_is_a_file_stops_with_a_clear_error(tmp_path):
    (tmp_path / "results").write_text("not a folder\n")
    result = snakemake(tmp_path, tiny_config("sweep"), check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "results: not a folder (expected the folder every output goes to" in output
    assert "Traceback" not in output
    assert (tmp_path / "results").read_text() == "not a folder\n"


def test_a_full_disk_during_torch_save_is_one_line_and_keeps_the_previous_state(mounted):
    folder = mounted("size=64k")
    job_state = State(folder / "run.json", "f")
    state = job_state.path
    job_state.save({"epoch": 1, "weights": torch.zeros(100)})
    with pytest.raises(DataError) as refused:
        job_state.save({"epoch": 2, "weights": torch.zeros(100_000)})  # 400 KB
    assert str(refused.value) == (
        f"{state}: cannot write the output (No space left on device)"
        " (expected a writable output folder with free space)"
    )
    assert torch.load(state, weights_only=True)["data"]["epoch"] == 1
    assert [p.name for p in state.parent.iterdir()] == [state.name]
