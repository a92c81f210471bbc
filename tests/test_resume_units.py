"""Loops over units keep one resume state, and the job saves it in one order after each unit.

- a loop whose units finish in any order (a sweep shard's seeds) keeps each finished unit
  through a kill, and only those;
- a state cut short or corrupted, or one of another fingerprint, is ignored with one line and
  the loop starts over; a resumed state tells what its earlier attempts spent;
- an older gpuflow's seed log is removed with one line;
- one writer at a time: a second job on the same output fails instead of overwriting it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from gpuflow.job import Job, current
from gpuflow.job.loop import Units
from gpuflow.job.paths import STATE, job_file
from gpuflow.job.state import make_fingerprint
from tests.conftest import BIN

ONE, OTHER = make_fingerprint(settings={"a": 1}), make_fingerprint(settings={"a": 2})


def seed_loop(out: Path, fingerprint: str = ONE) -> tuple[Units, dict[int, Any]]:
    """Six seeds that finish in any order, as a shard runs them, resumed from the job's state:
    the units and the result of each seed finished (a row or an error)."""
    job = current([out])
    results: dict[int, Any] = {}

    def restore(saved: dict[str, Any]) -> int:
        results.update(saved["results"])
        return len(results)

    state = job.state(fingerprint=fingerprint)
    return job.units(state, 6, "seeds", restore, lambda: {"results": results}), results


def finish(units: Units, results: dict[int, Any], seed: int, result: Any) -> None:
    results[seed] = result
    units.finished(len(results), f"after seed {seed}")


def test_a_loop_keeps_the_units_finished_in_any_order_through_a_kill_and_only_those(tmp_path):
    out = tmp_path / "shard~0.csv"
    units, results = seed_loop(out)
    finish(units, results, 4, {"seed": 4, "error": 0.5})
    finish(units, results, 0, "seed 0 failed: boom")
    finish(units, results, 2, {"seed": 2, "error": 0.25})
    results[5] = {"seed": 5}  # running when the job was killed: never saved
    units, results = seed_loop(out)
    assert units.done == 3 and results == {
        4: {"seed": 4, "error": 0.5},
        0: "seed 0 failed: boom",
        2: {"seed": 2, "error": 0.25},
    }


def test_a_state_cut_short_is_ignored_with_one_line_and_the_loop_starts_over(tmp_path, capsys):
    out = tmp_path / "shard~0.csv"
    units, results = seed_loop(out)
    finish(units, results, 1, {"seed": 1})
    path = job_file(out, STATE)
    path.write_bytes(path.read_bytes()[:100])  # a disk that filled up, a copy gone wrong
    capsys.readouterr()
    units, results = seed_loop(out)
    assert results == {} and units.done == 0
    line = capsys.readouterr().out
    assert line.startswith(f"ignoring {path}: unreadable resume state (") and line.endswith(
        "); starting over\n"
    )
    finish(units, results, 3, {"seed": 3})
    assert seed_loop(out)[1] == {3: {"seed": 3}}, "the next save replaces it"


def test_a_resumed_state_carries_the_seconds_its_earlier_attempts_spent(tmp_path):
    out = tmp_path / "shard~0.csv"
    units, results = seed_loop(out)
    units.state.started -= 30  # this attempt has run for 30 s when its seed finishes
    finish(units, results, 0, {"seed": 0})
    units, results = seed_loop(out)
    assert 30 <= units.state.earlier_s < 31
    finish(units, results, 1, {"seed": 1})
    saved = torch.load(job_file(out, STATE), weights_only=True)
    assert units.state.earlier_s <= saved["elapsed_s"] < units.state.earlier_s + 1


def test_a_state_of_another_fingerprint_starts_over_and_holds_no_work(tmp_path, capsys):
    out = tmp_path / "shard~0.csv"
    units, results = seed_loop(out)
    units.state.started -= 30
    finish(units, results, 0, {"seed": 0})
    capsys.readouterr()
    units, results = seed_loop(out, OTHER)
    assert results == {} and units.done == 0 and units.state.earlier_s == 0
    assert capsys.readouterr().out == (
        f"ignoring {job_file(out, STATE)}: it belongs to other inputs, settings or gpuflow"
        " version; starting over\n"
    )


@pytest.mark.parametrize("name", ["shard~0.csv.units.jsonl", "shard~0.csv.seeds.jsonl"])
def test_an_older_gpuflow_s_seed_log_is_removed_with_one_line(tmp_path, capsys, name):
    out = tmp_path / "shard~0.csv"
    legacy = job_file(out, STATE).with_name(name)
    legacy.parent.mkdir(parents=True)
    legacy.write_text('{"kind": "header", "fingerprint": "x"}\n')
    units, results = seed_loop(out)
    assert not legacy.exists() and results == {} and units.done == 0
    assert capsys.readouterr().out == (
        f"ignoring {legacy}: a seed log of an older gpuflow; starting over\n"
    )


def test_a_state_has_one_writer_at_a_time(tmp_path):
    out = tmp_path / "shard~0.csv"
    with Job("sweep_shard", [out]):
        units, results = seed_loop(out)
        finish(units, results, 0, {"seed": 0})
        second = subprocess.run(  # another fingerprint: it would start the state over
            [
                str(BIN / "python"), "-c",
                "import sys; from gpuflow.job import Job, current\n"
                "with Job('sweep_shard', [sys.argv[1]]):\n"
                "    current().state(settings='another').save({'results': {}})",
                str(out),
            ],
            capture_output=True, text=True,
        )  # fmt: skip
        assert second.returncode != 0
        assert "another job is writing this output" in second.stderr
        finish(units, results, 1, {"seed": 1})
    assert seed_loop(out)[1] == {0: {"seed": 0}, 1: {"seed": 1}}
