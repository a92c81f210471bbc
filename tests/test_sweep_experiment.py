"""A teacher-student run is a pure function of its seed, for both methods."""

from __future__ import annotations

import torch

from gpuflow.sweep.experiment import make_problem, run_seed

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
