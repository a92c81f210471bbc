"""`gpuflow gpu-check` on a machine without a GPU: every row runs at tiny sizes and is ok.

The same command on a GPU runs the same rows at paper sizes (see README, GPU acceptance check).
"""

from __future__ import annotations

import json

import pytest

from gpuflow.cli import main as gpuflow_main
from gpuflow.ops.gpu_check.rows import CheckRow

FAMILIES = (
    "perplexity",
    "out-of-memory",
    "sharded",
    "ssvae",
    "stacked",
    "scaling",
    "sweep",
    "locks",
    "telemetry",
)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, list[dict]]:
    out = tmp_path_factory.mktemp("gpu-check") / "gpu_check.json"
    code = gpuflow_main(["gpu-check", "--size", "tiny", "--device", "cpu", "--out", str(out)])
    return code, json.loads(out.read_text())


def test_every_row_of_the_cpu_smoke_test_is_ok(smoke):
    code, rows = smoke
    assert [row["path"] for row in rows if not row["ok"]] == []
    assert code == 0


def test_every_cuda_path_has_a_row_with_its_tolerance_and_rate(smoke):
    _, rows = smoke
    for family in FAMILIES:
        assert any(family in row["path"] for row in rows), family
    for row in rows:
        assert row["tolerance"] and row["deviation"] and row["sizes"] == "tiny"
    timed = [row for row in rows if row["unit"] in ("tokens/s", "examples/s")]
    assert len(timed) >= 9
    assert all(row["throughput"] > 0 and row["share_of_peak"] > 0 for row in timed)


def test_a_row_beyond_its_tolerance_is_not_ok_and_fails_the_command(tmp_path, monkeypatch):
    from gpuflow.ops.gpu_check import main as check_main

    def one_bad_row(sizes, devices, peaks, folder):
        return [CheckRow("made up", ok=False, tolerance="<= 1", deviation="2")]

    monkeypatch.setattr(check_main, "run_checks", one_bad_row)
    out = tmp_path / "gpu_check.json"
    assert gpuflow_main(["gpu-check", "--size", "tiny", "--device", "cpu", "--out", str(out)]) == 1
    assert json.loads(out.read_text())[0]["ok"] is False
