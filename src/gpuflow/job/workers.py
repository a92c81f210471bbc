"""One worker per device: items handed out as workers free up, a dead worker's items reassigned."""

from __future__ import annotations

import contextlib
import os
import queue
import sys
import traceback
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from functools import partial
from multiprocessing import get_context
from multiprocessing.connection import Connection, wait
from typing import Any

from gpuflow.errors import GpuflowError
from gpuflow.job.stopping import leave_to_parent, started_ignoring_stops

IN_HAND = 2
DEATHS_PER_ITEM = 2
POLL_S = 0.2
JOIN_S = 10.0
STOP = "stop"

Setup = Callable[[str], Callable[[Any], Any]]


@dataclass(frozen=True)
class Done:
    """What became of one item: its result, or the text of its error; and who did it."""

    key: Hashable
    result: Any = None
    error: str | None = None
    worker: int = 0
    where: str = ""


_log = partial(print, file=sys.stderr, flush=True)


def error_text() -> str:
    """The exception being handled: a GpuflowError's message, anything else its traceback."""
    error = sys.exc_info()[1]
    if isinstance(error, GpuflowError):
        return str(error)
    return traceback.format_exc(limit=4).strip()


def use_device(device: str) -> None:
    """Make `device` this process's current CUDA device (nothing for the CPU)."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.set_device(torch.device(device))


def _worker_main(setup: Setup, device: str, tasks: Any, conn: Connection, parent: int) -> None:
    """Run `setup(device)`'s function on each item received, until told to stop."""
    leave_to_parent()
    try:
        use_device(device)
        run = setup(device)
    except Exception:
        conn.send(("broken", error_text()))
        return
    conn.send(("ready", os.getpid()))
    while not conn.poll():
        try:
            task = tasks.get(timeout=POLL_S)
        except queue.Empty:
            if os.getppid() != parent:
                return
            continue
        if task is None or conn.poll():
            return
        key, payload = task
        conn.send(("start", key))
        try:
            message = ("done", key, run(payload))
        except Exception:
            message = ("failed", key, error_text())
        conn.send(message)


@dataclass
class _Worker:
    wid: int
    device: str
    process: Any
    tasks: Any
    conn: Connection
    hand: list[Hashable] = field(default_factory=list)
    running: Hashable | None = None

    @property
    def where(self) -> str:
        return f"worker {self.wid} ({self.device})"


class WorkerPool:
    """Workers `<name>-worker-<id>`, one per device, each running `setup(device)`'s function."""

    def __init__(
        self,
        setup: Setup,
        devices: Sequence[str],
        name: str,
        item: str = "item",
        log: Callable[[str], None] = _log,
        isolate: bool = True,
        max_replacements: int | None = None,
    ):
        if not devices:
            raise ValueError("a worker pool needs at least one device")
        self.setup, self.devices, self.name, self.item, self.log = setup, devices, name, item, log
        self.isolate = isolate or len(devices) > 1
        self.max_replacements = 3 * len(devices) if max_replacements is None else max_replacements
        self.deaths: list[str] = []
        self._context = get_context("spawn")
        self._workers: dict[int, _Worker] = {}
        self._next_wid = 0
        self._deaths_of: dict[Hashable, int] = {}
        self._line: deque[Hashable] = deque()
        self._pending: set[Hashable] = set()
        self._stopping = False

    def pids(self) -> list[int]:
        """Process ids of the workers now running."""
        return [w.process.pid for w in self._workers.values()]

    def run(
        self,
        work: dict[Hashable, Any],
        report: Callable[[Done], None],
        should_stop: Callable[[], bool] = lambda: False,
    ) -> None:
        """Run every item of `work` in order, calling `report` once per item as it finishes."""
        if not work:
            return
        if not self.isolate:
            self._run_here(work, report, should_stop)
            return
        self._line, self._pending, self._stopping = deque(work), set(work), False
        try:
            for device in self.devices[: len(work)]:
                self._start(device)
            while self._pending:
                if not self._stopping and should_stop():
                    self._stop_handing_out()
                self._deal(work)
                self._wait(report)
                if self._stopping and not self._workers:
                    return
        finally:
            self._stop_all()

    def _run_here(
        self,
        work: dict[Hashable, Any],
        report: Callable[[Done], None],
        should_stop: Callable[[], bool],
    ) -> None:
        device = self.devices[0]
        use_device(device)
        run = self.setup(device)
        where = f"{self.name} worker 0 ({device})"
        for key, payload in work.items():
            if should_stop():
                return
            try:
                done = Done(key, result=run(payload), where=where)
            except Exception:
                done = Done(key, error=error_text(), where=where)
            report(done)

    def _start(self, device: str) -> _Worker:
        wid, self._next_wid = self._next_wid, self._next_wid + 1
        with started_ignoring_stops():  # the worker, and the resource tracker spawning starts
            tasks = self._context.Queue()  # its feeder thread never blocks the parent
            conn, child_conn = self._context.Pipe(duplex=True)
            process = self._context.Process(
                target=_worker_main,
                args=(self.setup, device, tasks, child_conn, os.getpid()),
                name=f"{self.name}-worker-{wid}",
                daemon=True,
            )
            process.start()
        child_conn.close()
        worker = _Worker(wid, device, process, tasks, conn)
        self._workers[wid] = worker
        return worker

    def _deal(self, work: dict[Hashable, Any]) -> None:
        """Fill every worker's hand to IN_HAND, one item per worker in turn."""
        for size in range(IN_HAND):
            for worker in self._workers.values():
                if self._line and len(worker.hand) <= size:
                    key = self._line.popleft()
                    worker.hand.append(key)
                    worker.tasks.put((key, work[key]))

    def _stop_handing_out(self) -> None:
        self._stopping = True
        self._line.clear()
        for worker in self._workers.values():
            with contextlib.suppress(OSError):
                worker.conn.send(STOP)

    def _wait(self, report: Callable[[Done], None]) -> None:
        workers = self._workers.values()
        by_handle = {h: w for w in workers for h in (w.conn, w.process.sentinel)}
        gone: dict[int, _Worker] = {}
        for handle in wait(list(by_handle), timeout=POLL_S):
            worker = by_handle[handle]
            if not self._drain(worker, report):
                gone[worker.wid] = worker
        for worker in gone.values():
            self._bury(worker, report)

    def _drain(self, worker: _Worker, report: Callable[[Done], None]) -> bool:
        """Handle every message waiting from a worker; False once it has ended."""
        while True:
            try:
                if not worker.conn.poll():
                    return worker.process.is_alive()
                message = worker.conn.recv()
            except (EOFError, OSError):
                return False
            self._handle(worker, message, report)

    def _handle(self, worker: _Worker, message: tuple, report: Callable[[Done], None]) -> None:
        kind = message[0]
        if kind == "ready":
            self.log(f"worker {worker.wid} ready (pid {message[1]}, {worker.device})")
        elif kind == "broken":
            raise GpuflowError(f"{self.name} {worker.where} could not start: {message[1]}")
        elif kind == "start":
            worker.running = message[1]
        else:
            key = message[1]
            worker.running = None
            worker.hand.remove(key)
            if key in self._pending:
                self._pending.discard(key)
                result, error = (message[2], None) if kind == "done" else (None, message[2])
                report(Done(key, result, error, worker.wid, f"{self.name} {worker.where}"))

    def _bury(self, worker: _Worker, report: Callable[[Done], None]) -> None:
        """A worker ended: a dead worker's items go back in line unless the pool is stopping."""
        del self._workers[worker.wid]
        _end(worker)
        code, running = worker.process.exitcode, worker.running
        if self._stopping and code == 0:
            return
        left = [key for key in worker.hand if key in self._pending]
        where = f" while running {self.item} {running}" if running in self._pending else ""
        fate = "are left undone (stopping)" if self._stopping else "go back to the pool"
        note = (
            f"worker {worker.wid} (pid {worker.process.pid}, {worker.device}) died with exit"
            f" code {code}{where}; its {len(left)} unfinished {self.item}(s) {left} {fate}"
        )
        self.deaths.append(note)
        self.log(f"WARNING: {note}")
        if self._stopping:
            return
        if running in self._pending:
            self._deaths_of[running] = self._deaths_of.get(running, 0) + 1
            if self._deaths_of[running] >= DEATHS_PER_ITEM:
                left.remove(running)
                self._fail(
                    running,
                    f"{DEATHS_PER_ITEM} workers died running this {self.item}"
                    f" (last exit code {code})",
                    report,
                )
        self._line.extendleft(reversed(left))
        if self._line and not self._workers:
            if self.max_replacements > 0:
                self.max_replacements -= 1
                started = self._start(worker.device)
                self.log(f"started replacement worker {started.wid} on {worker.device}")
            else:
                while self._line:
                    self._fail(
                        self._line.popleft(), "every worker died and no replacement is left", report
                    )

    def _fail(self, key: Hashable, error: str, report: Callable[[Done], None]) -> None:
        self._pending.discard(key)
        report(Done(key, error=error, worker=-1, where=f"{self.name} pool"))

    def _stop_all(self) -> None:
        self._stop_handing_out()
        for worker in self._workers.values():
            worker.tasks.put(None)
        for worker in self._workers.values():
            _end(worker)
            worker.tasks.close()
        self._workers.clear()


def _end(worker: _Worker) -> None:
    """Wait for a worker to end (killed after JOIN_S); never wait on its task queue."""
    worker.process.join(timeout=JOIN_S)
    if worker.process.is_alive():
        worker.process.kill()
        worker.process.join()
    worker.tasks.cancel_join_thread()
