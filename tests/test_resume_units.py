"""Loops over units keep one resume state, and the job saves it in one order after each unit.

- a loop whose units finish in any order (a sweep shard's seeds) keeps each finished unit
  through a kill, and only those;
- a state cut short or corrupted, or one of another fingerprint, is ignored with one line and
  the loop starts over; a resumed state tells what its earlier attempts spent;
- an older gpuflow's seed log is removed with one line;
- one writer at a time: a second job on the same output fails instead of overwriting it;
- progress never counts a unit that a kill would lose: in every kind of loop (epochs in order,
  seeds and scored chunks in any order) the state holds a unit before the progress counts it.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from gpuflow.cli import main as gpuflow_main
from gpuflow.job import Job, current
from gpuflow.job import progress as progress_module
from gpuflow.job.loop import Units
from gpuflow.job.paths import PROGRESS, STATE, job_file
from gpuflow.job.state import make_fingerprint
from gpuflow.ssvae.train import Run, train
from tests.conftest import BIN
from tests.test_fluency_stop_resume import texts
from tests.test_ssvae_train import data_path, tiny
from tests.test_sweep_shard import SETTINGS as SHARD_SETTINGS
from tests.test_sweep_shard import shard_command

__all__ = ["data_path", "texts"]  # fixtures, shared with the SSVAE and fluency tests

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


# --- progress never counts a unit that a kill would lose ---------------------------------------

KEPT: dict[str, Callable[[dict[str, Any]], int]] = {  # the units a state holds, by unit
    "epochs": lambda data: data["epoch"],
    "seeds": lambda data: len(data["rows"]) + len(data["failed"]),
    "texts": lambda data: int(data["done"].sum()),
}


@pytest.fixture
def progress_and_state(monkeypatch) -> list[tuple[str, float, float, int]]:
    """At every progress write (none skipped): its unit, done and total, and the units the
    job's resume state holds at that moment, which is all that a kill right then would keep."""
    seen: list[tuple[str, float, float, int]] = []
    write = progress_module.write_progress

    def checking(path: Path, done: float, total: float, unit: str, *args: Any) -> None:
        state = Path(path).with_name(Path(path).name.removesuffix(PROGRESS) + STATE)
        kept = KEPT[unit](torch.load(state, weights_only=True)["data"]) if state.exists() else 0
        seen.append((unit, done, total, kept))
        write(path, done, total, unit, *args)

    monkeypatch.setattr(progress_module, "write_progress", checking)
    monkeypatch.setattr(progress_module, "EVERY_S", 0.0)
    return seen


def epochs_in_order(folder: Path, data: Path, texts: Path) -> None:
    runs = [Run("m2", 0.05, 0.0, 1.0, 0)]
    train(runs, data, tiny(epochs=3), [folder / "results" / "ssvae" / "metrics.json"])


def seeds_in_any_order(folder: Path, data: Path, texts: Path) -> None:
    argv = shard_command(folder / "results" / "sweep" / "shard~0.csv", 1, seeds="0:3")[1:]
    quick = {**SHARD_SETTINGS, "gnc": {**SHARD_SETTINGS["gnc"], "max_guesses": 200}}
    argv[argv.index("--settings") + 1] = json.dumps(quick)
    assert gpuflow_main(argv) == 0


def chunks_in_any_order(folder: Path, data: Path, texts: Path) -> None:
    out = folder / "results" / "fluency" / "toxicity.csv"
    runtime = {"toxicity": {"batch_size": 2, "chunk_texts": 6}}  # three batches a chunk
    argv = ["toxicity", "--texts", str(texts), "--out", str(out)]
    assert gpuflow_main([*argv, "--runtime", json.dumps(runtime)]) == 0


@pytest.mark.parametrize(
    "loop, unit",
    [(epochs_in_order, "epochs"), (seeds_in_any_order, "seeds"), (chunks_in_any_order, "texts")],
    ids=["epochs in order", "seeds in any order", "chunks in any order"],
)
def test_progress_never_counts_a_unit_that_a_kill_would_lose(
    tmp_path, data_path, texts, progress_and_state, loop, unit
):
    loop(tmp_path, data_path, texts)
    writes = [(done, total, kept) for seen, done, total, kept in progress_and_state]
    assert {seen[0] for seen in progress_and_state} == {unit}
    assert writes[-1][0] == writes[-1][1] > 0 and len(writes) > 2, "it ran to the end"
    assert all(done <= kept for done, _, kept in writes), writes
