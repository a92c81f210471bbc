"""A teacher-student run is a pure function of its seed; the progress file survives being killed."""

from __future__ import annotations

import json

import torch

from gpuflow.sweep.experiment import make_problem, run_seed
from gpuflow.sweep.seedlog import SeedLog, seeds_path

DATA = {"seed": 0, "input_dim": 8, "output_dim": 8, "n_train": 4, "label_noise": 0.0}
GD = {"lr": 0.5, "init_scale": 0.01, "loss_threshold": 0.5, "max_steps": 10000}
GNC = {"loss_threshold": 0.5, "max_guesses": 20000, "batch_size": 1024}
CPU = torch.device("cpu")


def settings(method: str, rank: int = 2, width: int = 4, **changes) -> dict:
    blocks = {"gd": {**GD, **changes}, "gnc": {**GNC, **changes}}
    return {
        "method": method,
        "teacher_rank": rank,
        "student_width": width,
        "data": DATA,
        method: blocks[method],
    }


def without_time(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "wall_s"}


def test_the_teacher_has_the_asked_rank_and_unit_norm():
    for rank in (2, 4, 8):
        teacher = make_problem(DATA, rank, seed=3, device=CPU).teacher
        assert torch.linalg.matrix_rank(teacher) == rank
        assert abs(float(teacher.norm()) - 1) < 1e-5


def test_teacher_and_data_depend_on_seed_and_rank_only():
    first = make_problem(DATA, 4, seed=1, device=CPU)
    again = make_problem(DATA, 4, seed=1, device=CPU)
    other = make_problem(DATA, 4, seed=2, device=CPU)
    assert torch.equal(first.labels, again.labels)
    assert not torch.equal(first.labels, other.labels)


def test_a_seed_gives_the_same_row_every_time_for_both_methods():
    for method in ("gd", "gnc"):
        rows = [without_time(run_seed(settings(method), 5, CPU)) for _ in range(2)]
        assert rows[0] == rows[1]
        assert rows[0] != without_time(run_seed(settings(method), 6, CPU))


def test_gradient_descent_stops_once_the_train_error_is_under_the_threshold():
    row = run_seed(settings("gd", loss_threshold=0.1), 0, CPU)
    assert row["reached_threshold"] and row["train_error"] < 0.1
    assert 0 < row["steps"] < GD["max_steps"]
    assert row["guesses"] is None


def test_gradient_descent_that_spends_its_budget_says_so():
    row = run_seed(settings("gd", max_steps=3), 0, CPU)
    assert row["steps"] == 3 and not row["reached_threshold"]


def test_guess_and_check_counts_the_guesses_it_needed():
    rows = [run_seed(settings("gnc", width=8, rank=8), seed, CPU) for seed in range(4)]
    reached = [r for r in rows if r["reached_threshold"]]
    assert reached, "with the default dimensions most seeds succeed within 20k guesses"
    for row in reached:
        assert row["train_error"] < GNC["loss_threshold"]
        assert 1 <= row["guesses"] <= GNC["max_guesses"]
        assert row["steps"] is None


def test_guess_and_check_that_cannot_succeed_spends_the_budget_and_reports_its_best():
    row = run_seed(settings("gnc", loss_threshold=1e-9, max_guesses=3000), 0, CPU)
    assert not row["reached_threshold"]
    assert row["guesses"] == 3000
    assert 0 < row["train_error"] < 1


def test_the_seed_log_keeps_finished_seeds_and_cuts_a_torn_last_line(tmp_path):
    out = tmp_path / "shard~0.csv"
    path = seeds_path(out)
    progress = SeedLog(out, {"a": 1}).open()
    progress.add_ok(0, {"seed": 0, "x": 0.5})
    progress.add_failed(1, "boom")
    progress.close()
    with open(path, "a", encoding="utf-8") as handle:
        handle.write('{"kind": "seed", "seed": 2, "sta')  # killed mid-write
    again = SeedLog(out, {"a": 1}).open()
    assert again.done() == {0: {"seed": 0, "x": 0.5}}
    again.add_ok(2, {"seed": 2})
    again.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line.get("seed") for line in lines] == [None, 0, 1, 2]


def test_a_reopened_seed_log_carries_the_seconds_its_earlier_attempts_spent(tmp_path):
    out = tmp_path / "shard~0.csv"
    first = SeedLog(out, {"a": 1}).open()
    first.started -= 30  # this attempt has run for 30 s when its seeds finish
    first.add_ok(0, {"seed": 0})
    first.add_failed(1, "boom")
    first.close()
    again = SeedLog(out, {"a": 1}).open()
    assert 30 <= again.earlier_s < 31, "the seconds up to the last seed line, failed or not"
    again.add_ok(1, {"seed": 1})
    again.close()
    last = json.loads(seeds_path(out).read_text().splitlines()[-1])
    assert again.earlier_s <= last["elapsed_s"] < again.earlier_s + 1
    other = SeedLog(out, {"a": 2}).open()
    other.close()
    assert other.started_over and other.earlier_s == 0, "a log started over holds no work"


def test_a_seed_log_written_for_other_settings_is_started_over(tmp_path):
    out = tmp_path / "shard~0.csv"
    first = SeedLog(out, {"a": 1}).open()
    first.add_ok(0, {"seed": 0})
    first.close()
    second = SeedLog(out, {"a": 2}).open()
    second.close()
    assert second.started_over and second.done() == {}
