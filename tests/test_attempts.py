"""Only the newest attempt of a job writes: a superseded attempt stops without writing.

A requeued SLURM job starts again while its last attempt may still run on a node the controller
lost, and on a shared file system whose locks do not reach across nodes the two do not see each
other's output locks. Here the first attempt's lock files are removed while it trains (what the
second attempt sees from another node), and a second attempt of the same job starts: it resumes
from the first's state and finishes; the first stops at its next save, naming the newer one, and
the outputs equal an undisturbed run's.
"""

from __future__ import annotations

import signal
import subprocess

import pytest

from gpuflow.job.atomic import write_text
from gpuflow.job.attempt import Superseded, check, claim, release
from gpuflow.job.outputlock import lock_path
from gpuflow.job.paths import ATTEMPT, STATE, job_file
from tests.conftest import wait_for, wait_for_file, workflow_env
from tests.slurm import grid_faults
from tests.test_ssvae_train import comparable, data_path, train_command

__all__ = ["data_path"]  # the fixture, shared with the SSVAE training tests

EPOCHS = 8


def test_a_write_after_a_newer_attempt_named_itself_is_refused_and_leaves_the_file(tmp_path):
    output = tmp_path / "results" / "family" / "out.txt"
    claim(output)
    try:
        write_text(output, "mine\n")
        job_file(output, ATTEMPT).write_text("SLURM job 7 restart 1, host other, pid 1\n")
        with pytest.raises(Superseded, match=r"superseded by a newer attempt .*restart 1"):
            write_text(output, "stale\n")
        assert output.read_text() == "mine\n"
        with pytest.raises(Superseded):
            check()
    finally:
        release()
    assert job_file(output, ATTEMPT).exists(), "the newer attempt's file stays"


def test_an_attempt_superseded_on_a_shared_file_system_stops_without_writing(data_path, tmp_path):
    whole, shared = tmp_path / "whole", tmp_path / "shared"
    whole.mkdir()
    shared.mkdir()
    subprocess.run(train_command(data_path, whole, EPOCHS), env=workflow_env(), check=True)
    env = {
        **workflow_env(),
        **grid_faults.install(tmp_path / "bin", {"ssvae-train": "epoch-floor:1.0"}),
    }
    command = ["gpuflow", *train_command(data_path, shared, EPOCHS)[1:]]  # the slowed gpuflow
    first = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    state, attempt = (job_file(shared / "seed~4.json", name) for name in (STATE, ATTEMPT))
    wait_for_file(state, first, timeout=120)
    first.send_signal(signal.SIGSTOP)  # the lost node: it trains on once the second has started
    named_first = attempt.read_text()
    for output in ("seed~4.json", "seed~9.json"):
        lock_path(shared / output).unlink()  # as the second node sees it: no lock held
    second = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    wait_for(lambda: attempt.read_text() != named_first, "the second attempt", timeout=120)
    first.send_signal(signal.SIGCONT)
    wait_for(lambda: first.poll() is not None, "the first attempt to stop", timeout=120)
    _, first_err = first.communicate()
    second_out, second_err = second.communicate(timeout=300)
    assert first.returncode == 2, first_err[-2000:]
    assert "error: superseded by a newer attempt of this job" in first_err.splitlines()[-1]
    assert second.returncode == 0, second_err[-2000:]
    assert "resumed from" in second_out + second_err
    for output in ("seed~4.json", "seed~9.json"):
        assert comparable(shared / output) == comparable(whole / output)
    assert not job_file(shared / "seed~4.json", ATTEMPT).exists(), (
        "the finished attempt's file goes"
    )
