"""Stop a step cleanly when SLURM ends its time or preempts it, so its retry resumes."""

from __future__ import annotations

import contextlib
import ctypes
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
STOPS_AND_CTRL_C = (*STOP_SIGNALS, signal.SIGINT)


class Stopped(BaseException):
    """The step stopped on SLURM's request; its saved state lets the next run resume."""


class _Request:
    signal_name: str | None = None
    deferred = False


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if _Request.signal_name is not None:
        return  # the same request again (SIGTERM after SIGUSR1): the step is already stopping
    _Request.signal_name = signal.Signals(signum).name
    if not _Request.deferred:
        raise Stopped(f"stopped by {_Request.signal_name} before finishing (nothing saved)")


def install() -> None:
    """Handle SIGTERM and SIGUSR1 as a stop request in this process (the main thread)."""
    _Request.signal_name = None
    _Request.deferred = False
    for signum in STOP_SIGNALS:
        signal.signal(signum, _on_signal)


def ignore_warning() -> None:
    """Ignore SLURM's warning signal (SIGUSR1) in a process that must outlive it."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def leave_to_parent() -> None:
    """In a worker process: the parent decides when to stop, and the worker dies with it."""
    for signum in STOPS_AND_CTRL_C:
        signal.signal(signum, signal.SIG_IGN)
    if sys.platform.startswith("linux"):  # elsewhere the worker does not die with its parent
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@contextlib.contextmanager
def _handled_by(
    handler: Callable[[int, FrameType | None], Any] | signal.Handlers,
) -> Iterator[None]:
    """`handler` for the stop signals and Ctrl-C inside the block; each one's own back after."""
    handlers = {signum: signal.getsignal(signum) for signum in STOPS_AND_CTRL_C}
    taken = {s: own for s, own in handlers.items() if own not in (None, signal.SIG_IGN)}
    try:
        for signum in taken:
            signal.signal(signum, handler)
        yield
    finally:
        for signum, own in taken.items():
            signal.signal(signum, own)


def started_ignoring_stops() -> contextlib.AbstractContextManager[None]:
    """Processes started inside inherit ignored stop signals (and Ctrl-C) across exec."""
    return _handled_by(signal.SIG_IGN)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Stop requests and Ctrl-C that arrive inside the block take effect when it ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    try:
        with _handled_by(lambda signum, frame: arrived.append(signum)):
            yield
    finally:
        for signum in dict.fromkeys(arrived):
            signal.raise_signal(signum)


def requested() -> str | None:
    """The name of the signal that asked this process to stop, or None."""
    return _Request.signal_name


def defer() -> None:
    """From now on a stop request waits for the loop's next `stop_if_requested`."""
    _Request.deferred = True


def stop_if_requested(where: str, anyone: bool | None = None) -> None:
    """Raise Stopped when a stop was requested; call it right after saving the state."""
    asked = requested() is not None if anyone is None else anyone
    if asked:
        name = requested() or "a stop request of another rank"
        raise Stopped(f"stopped by {name} {where}; the next run resumes from there")
