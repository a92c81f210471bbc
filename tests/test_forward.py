"""gpuflow.job.forward: a signal sent to the forwarder alone (all SLURM's proctrack/cgroup sends
a job step's first process) reaches every process below it, and the forwarder outlives them all,
also a grandchild whose parent died of the signal first, as a step's shell does."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import wait_for

SAVER = """
import signal, sys, time
from pathlib import Path
log = Path(sys.argv[1])
def stop(signum, frame):
    time.sleep(1.0)  # saving its state
    log.write_text(f"saved after {signal.Signals(signum).name}")
    sys.exit(3)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGUSR1, stop)
Path(sys.argv[2]).touch()
time.sleep(60)
"""


def start(tmp_path: Path, shell: bool) -> tuple[subprocess.Popen, Path]:
    """The forwarder over a Python step that saves for 1 s when stopped (with `shell`, under
    `sh -c`, which dies of the signal at once); returns once the step runs."""
    script = tmp_path / "saver.py"
    script.write_text(SAVER)
    log, ready = tmp_path / "saved.txt", tmp_path / "ready"
    step = [sys.executable, str(script), str(log), str(ready)]
    command = ["sh", "-c", " ".join(step) + "; exit $?"] if shell else step
    forwarder = subprocess.Popen([sys.executable, "-m", "gpuflow.job.forward", "--", *command])
    wait_for(ready.exists, "the step to start", timeout=30, interval=0.05)
    return forwarder, log


def test_a_stop_sent_to_the_forwarder_alone_reaches_the_step_below_its_shell(tmp_path):
    forwarder, log = start(tmp_path, shell=True)
    forwarder.send_signal(signal.SIGTERM)
    assert forwarder.wait(timeout=30) == 128 + signal.SIGTERM, "the shell died of it"
    assert log.read_text() == "saved after SIGTERM", "adopted and waited for while it saved"


def test_the_warning_signal_is_forwarded_and_the_command_s_status_returned(tmp_path):
    forwarder, log = start(tmp_path, shell=False)
    began = time.monotonic()
    forwarder.send_signal(signal.SIGUSR1)
    assert forwarder.wait(timeout=30) == 3
    assert log.read_text() == "saved after SIGUSR1"
    assert time.monotonic() - began >= 1.0


def test_the_forwarder_runs_the_command_to_its_end_with_its_status(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "gpuflow.job.forward", "--", "sh", "-c", "exit 7"], timeout=30
    )
    assert done.returncode == 7
