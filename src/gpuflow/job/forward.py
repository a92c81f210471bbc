"""Run a command so that SLURM's signals reach every process under it, under any proctrack."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path

FORWARDED = (
    signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT, signal.SIGHUP, signal.SIGCONT,
)  # fmt: skip
PR_SET_CHILD_SUBREAPER = 36


def descendants(root: int) -> list[int]:
    """The processes below `root` (children, theirs, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def forward(signum: int) -> None:
    """Send `signum` to every process below this one."""
    for pid in descendants(os.getpid()):
        try:
            os.kill(pid, signum)
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
