"""Stopping on SLURM's request: SIGUSR1 (the profile's warning before the time limit) and SIGTERM
(the limit itself, or preemption) end a step with one line; a training loop first finishes and
saves its epoch, and the retry resumes there to the numbers of an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
import torch

from gpuflow.job import record as job_record_module
from gpuflow.job import stopping
from gpuflow.job.paths import RECORD, STATE, job_file
from gpuflow.job.record import job_record
from gpuflow.job.state import read_state
from tests.conftest import BIN, wait_for_file, workflow_env
from tests.test_ssvae_train import comparable, data_path, train_command

__all__ = ["data_path"]  # the fixture, shared with the SSVAE training tests


EPOCHS = 6


@pytest.fixture(scope="module")
def whole(data_path, tmp_path_factory):
    """The same training, uninterrupted: what every stopped and resumed one must equal."""
    folder = tmp_path_factory.mktemp("whole")
    subprocess.run(
        train_command(data_path, folder, EPOCHS),
        check=True,
        env=workflow_env(),
        capture_output=True,
    )
    return folder


@pytest.mark.parametrize("signum", [signal.SIGUSR1, signal.SIGTERM], ids=lambda s: s.name)
def test_a_warned_training_saves_after_its_epoch_stops_and_the_retry_resumes_there(
    data_path, whole, tmp_path, signum
):
    epochs = EPOCHS
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    state = job_file(stopped / "seed~4.json", STATE)
    process = subprocess.Popen(
        train_command(data_path, stopped, epochs),
        env=workflow_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for_file(state, process, 120)
    process.send_signal(signum)
    out, err = process.communicate(timeout=120)
    saved = torch.load(state, weights_only=True)["data"]["epoch"]
    assert process.returncode == 2, err
    assert f"stopped by {signum.name} after epoch {saved} of {epochs}" in err
    assert f"epoch {saved}/{epochs}" in out, "the epoch in progress was finished, then saved"
    assert saved < epochs and not (stopped / "seed~4.json").exists()
    record = job_file(stopped / "seed~4.json", RECORD)
    first = json.loads(record.read_text())
    assert first["status"] == "stopped"
    retry = subprocess.run(
        train_command(data_path, stopped, epochs),
        check=True,
        env=workflow_env(),
        capture_output=True,
        text=True,
    )
    assert f"resumed from {state} after epoch {saved}" in retry.stdout
    assert f"epoch {saved}/{epochs}" not in retry.stdout, "finished epochs are not redone"
    for name in ("seed~4.json", "seed~9.json"):
        assert comparable(stopped / name) == comparable(whole / name)
    earlier = json.loads(record.read_text())["timings"]["earlier_attempts_s"]
    assert 0 < earlier < first["ended"] - first["started"], "the stopped attempt's saved work"


def ctrl_c_at_its_default() -> None:
    """In the child, before exec: Ctrl-C's default action, as for a command run at a terminal.

    A suite started in the background by a script (`make test &`) inherits an ignored SIGINT,
    and so would the step, which would then rightly ignore Ctrl-C.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


STOPS_OUTSIDE_A_LOOP = pytest.mark.parametrize(
    "signum, status, line",
    [
        (signal.SIGTERM, 2, "error: stopped by SIGTERM before finishing (nothing saved)"),
        (signal.SIGINT, 130, "error: interrupted by Ctrl-C"),
    ],
    ids=["SIGTERM", "Ctrl-C"],
)


def assert_stopped_with_one_line_and_only_its_record(
    returncode: int, err: str, folder, out, status: int, line: str
) -> None:
    """The probe ended with `status` and one line; it wrote its record saying so, nothing else."""
    assert (returncode, err.strip().splitlines()) == (status, [f"gpuflow probe: {line}"])
    record = job_file(out, RECORD)
    assert [p for p in folder.rglob("*") if p.is_file()] == [record]  # no output, its record
    assert json.loads(record.read_text())["status"] == "stopped"


@STOPS_OUTSIDE_A_LOOP
def test_a_step_outside_a_loop_stops_at_once_with_one_line_and_writes_nothing(
    tmp_path, signum, status, line
):
    out = tmp_path / "record.json"
    process = subprocess.Popen(
        [str(BIN / "gpuflow"), "probe", "--out", str(out), "--hold", "60"],
        env=workflow_env(),
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_at_its_default,
    )
    wait_for_file(job_file(out, RECORD), process, 60)  # written once the handler is in place
    process.send_signal(signum)
    _, err = process.communicate(timeout=30)
    assert_stopped_with_one_line_and_only_its_record(
        process.returncode, err, tmp_path, out, status, line
    )


SIGNAL_WHILE_TORCH_IMPORTS_NUMPY = """
import os, signal, sys

signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C as at a terminal

class SignalAtNumpy:
    def find_spec(self, name, path=None, target=None):
        if name == "numpy":  # first imported by torch's C extension, as it initialises
            sys.meta_path.remove(self)
            os.kill(os.getpid(), int(sys.argv[1]))
        return None

sys.meta_path.insert(0, SignalAtNumpy())
from gpuflow.cli import main
sys.exit(main(sys.argv[2:]))
"""


@STOPS_OUTSIDE_A_LOOP
def test_a_signal_while_the_step_imports_torch_stops_it_once_the_import_is_done(
    tmp_path, signum, status, line
):
    """torch's C extension swallows an exception raised while it imports numpy: the signal's
    (Stopped, KeyboardInterrupt) waits for the import, or the step would run on and finish."""
    out = tmp_path / "record.json"
    step = ["probe", "--out", str(out), "--hold", "5"]
    ended = subprocess.run(
        [str(BIN / "python"), "-c", SIGNAL_WHILE_TORCH_IMPORTS_NUMPY, str(int(signum)), *step],
        env=workflow_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert_stopped_with_one_line_and_only_its_record(
        ended.returncode, ended.stderr, tmp_path, out, status, line
    )


@pytest.fixture
def stop_handlers():
    """gpuflow's stop handlers in this process for one test (conftest's `no_stop_handling_left`
    withdraws them and any request they took)."""
    stopping.install()


def sigterm_after(function):
    """`function`, after which SLURM's SIGTERM reaches this process."""

    def interrupted(*args, **kwargs):
        result = function(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
        return result

    return interrupted


def test_a_stop_while_the_start_record_is_written_ends_the_step_before_it_runs(
    tmp_path, monkeypatch, stop_handlers
):
    monkeypatch.setattr(
        job_record_module, "write_json", sigterm_after(job_record_module.write_json)
    )
    ran = []
    with pytest.raises(stopping.Stopped), job_record("probe", [tmp_path / "out.json"], 1.0):
        ran.append("the step")
    assert ran == []
    record = job_file(tmp_path / "out.json", RECORD)
    assert json.loads(record.read_text())["status"] == "stopped"
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == [record]  # no lock, no temporary


def test_a_stop_while_the_resume_state_is_read_is_not_taken_for_an_unreadable_state(
    tmp_path, monkeypatch, stop_handlers
):
    path = tmp_path / "state.pt"
    torch.save({"epoch": 3}, path)
    monkeypatch.setattr(torch, "load", sigterm_after(torch.load))
    with pytest.raises(stopping.Stopped):
        read_state(path, "cpu")


def test_a_step_after_a_deferring_one_in_the_same_process_stops_at_once(stop_handlers):
    stopping.defer()  # the earlier step's training loop
    stopping.install()  # the next step's job
    assert stopping.requested() is None
    with pytest.raises(stopping.Stopped):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)


def test_a_second_signal_does_not_interrupt_a_step_that_is_already_stopping(stop_handlers):
    cleaned_up = []
    with pytest.raises(stopping.Stopped, match="stopped by SIGUSR1"):
        try:
            os.kill(os.getpid(), signal.SIGUSR1)  # the profile's warning
            time.sleep(5)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # the time limit, while the step cleans up
            cleaned_up.append("record and locks")
    assert cleaned_up == ["record and locks"]


def test_a_stop_request_inside_a_held_block_takes_effect_when_the_block_ends(stop_handlers):
    handlers = {s: signal.getsignal(s) for s in stopping.STOPS_AND_CTRL_C}
    finished = []
    with pytest.raises(stopping.Stopped, match="stopped by SIGTERM"), stopping.held():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)  # where the handler would have raised
        finished.append("the import")
    assert finished == ["the import"]
    assert {s: signal.getsignal(s) for s in handlers} == handlers
    assert stopping.requested() == "SIGTERM"


def test_a_signal_ignored_before_a_held_block_stays_ignored_through_it(stop_handlers):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a step started in the background by a shell
    with stopping.held():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # what a process started here gets
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
