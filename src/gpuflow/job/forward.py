"""Run a command so that SLURM's signals reach every process under it, under any proctrack."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

import psutil

FORWARDED = (
    signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT, signal.SIGHUP, signal.SIGCONT,
)  # fmt: skip
PR_SET_CHILD_SUBREAPER = 36


def forward(signum: int) -> None:
    """Send `signum` to every process below this one (children, theirs, ...)."""
    for child in psutil.Process().children(recursive=True):
        try:
            os.kill(child.pid, signum)
        except ProcessLookupError:
            continue


def run(command: list[str]) -> int:
    """Run `command`, forwarding signals to all below it; wait for every process below it."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    arrived: list[int] = []
    for signum in FORWARDED:
        signal.signal(signum, lambda number, _: arrived.append(number))
    child = subprocess.Popen(command)
    for signum in FORWARDED:
        signal.signal(signum, lambda number, _: forward(number))
    for signum in arrived:  # before the command started: it gets them now
        forward(signum)
    status = None
    while True:
        try:
            pid, code = os.wait()
        except ChildProcessError:
            break
        if pid == child.pid:
            status = os.waitstatus_to_exitcode(code)
    assert status is not None
    return status if status >= 0 else 128 - status


def main(argv: list[str]) -> int:
    """`python -m gpuflow.job.forward -- COMMAND...`."""
    command = argv[1:] if argv[:1] == ["--"] else argv
    if not command:
        print("usage: python -m gpuflow.job.forward -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    return run(command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
