"""Run seeds in worker processes, one per device, and survive workers that die.

The parent deals the seeds round-robin to one worker per device (spawned, so CUDA initialises
in each child), and each worker sends back one message per seed on its own pipe. A worker that
dies (killed, out of memory) is noticed by the parent at once (its process sentinel): its
unfinished seeds go to the surviving workers round-robin, or to a replacement worker on the same
device when none survive. A seed that was running in two workers that died is failed instead of
killing a third. Workers die with their parent (PR_SET_PDEATHSIG on Linux, and a check of the
parent's pid between seeds), so a killed job leaves no orphans.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing as mp
import os
import signal
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from gpuflow.job.stopping import die_with_parent

DEATHS_PER_SEED = 2
POLL_S = 0.2
IN_FLIGHT = 2


@dataclass
class Outcome:
    """What became of one seed: a result row, or an error text."""

    seed: int
    row: dict[str, Any] | None = None
    error: str | None = None


@dataclass
class _Worker:
    wid: int
    device: str
    process: Any
    tasks: Connection
    results: Connection
    assigned: list[int] = field(default_factory=list)
    running: int | None = None
    sent: int = 0

    def give(self, seed: int) -> None:
        """Deal a seed to this worker; it is sent once the worker has room (see feed)."""
        self.assigned.append(seed)
        self.feed()

    def feed(self) -> None:
        """Keep at most IN_FLIGHT seeds in the worker's pipe, so no pipe ever fills up."""
        while self.sent < len(self.assigned) and self.sent < IN_FLIGHT:
            with contextlib.suppress(OSError):
                self.tasks.send(self.assigned[self.sent])
            self.sent += 1


def _worker_main(
    wid: int,
    device_name: str,
    target: str,
    settings: dict,
    tasks: Connection,
    results: Connection,
    parent: int,
) -> None:
    """Worker loop: run each seed it is given and report it, until told to stop (None).

    SLURM's stop warning (SIGUSR1) reaches every process of the job: the parent decides when
    to stop (after the seeds in hand), so a worker ignores it.
    """
    die_with_parent()
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    import torch

    torch.set_num_threads(1)
    device = torch.device(device_name)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    module_name, function_name = target.split(":")
    run = getattr(importlib.import_module(module_name), function_name)
    results.send(("ready", wid, os.getpid()))
    while True:
        if not tasks.poll(1.0):
            if os.getppid() != parent:
                return
            continue
        seed = tasks.recv()
        if seed is None:
            return
        results.send(("start", wid, seed))
        try:
            message = ("done", wid, seed, run(settings, seed, device))
        except Exception:
            message = ("failed", wid, seed, traceback.format_exc(limit=4).strip())
        results.send(message)


class SeedPool:
    """Run `target(settings, seed, device)` for every seed across one worker per device.

    Each worker has its own task pipe and result pipe, so a worker killed mid-message can
    break only its own pipes, never a lock the others share.
    """

    def __init__(
        self,
        target: str,
        settings: dict[str, Any],
        devices: list[str],
        log: Callable[[str], None],
        max_replacements: int | None = None,
    ):
        self.target, self.settings, self.devices, self.log = target, settings, devices, log
        self.max_replacements = 3 * len(devices) if max_replacements is None else max_replacements
        self.context = mp.get_context("spawn")
        self.workers: dict[int, _Worker] = {}
        self.deaths: list[str] = []
        self._next_wid = 0
        self._deaths_of_seed: dict[int, int] = {}

    def _start(self, device: str) -> _Worker:
        wid, self._next_wid = self._next_wid, self._next_wid + 1
        task_recv, task_send = self.context.Pipe(duplex=False)
        result_recv, result_send = self.context.Pipe(duplex=False)
        process = self.context.Process(
            target=_worker_main,
            args=(wid, device, self.target, self.settings, task_recv, result_send, os.getpid()),
            name=f"sweep-worker-{wid}",
            daemon=True,
        )
        process.start()
        task_recv.close()
        result_send.close()
        worker = _Worker(wid, device, process, task_send, result_recv)
        self.workers[wid] = worker
        return worker

    def run(self, seeds: list[int], report: Callable[[Outcome], None]) -> None:
        """Run all seeds; call `report` once per seed, in the order they finish."""
        pending = set(seeds)
        if not pending:
            return
        try:
            started = [self._start(d) for d in self.devices[: len(seeds)]]
            for i, seed in enumerate(seeds):
                started[i % len(started)].give(seed)
            while pending:
                by_handle = {}
                for worker in self.workers.values():
                    by_handle[worker.results] = worker
                    by_handle[worker.process.sentinel] = worker
                ready = wait(list(by_handle), timeout=POLL_S)
                dead = []
                for handle in ready:
                    worker = by_handle[handle]
                    if not self._drain(worker, pending, report) and worker not in dead:
                        dead.append(worker)
                for worker in dead:
                    self._bury(worker, pending, report)
        finally:
            self._stop_all()

    def _drain(self, worker: _Worker, pending: set[int], report) -> bool:
        """Handle every message waiting from a worker; False once it is gone."""
        try:
            while worker.results.poll():
                self._handle(worker, worker.results.recv(), pending, report)
        except (EOFError, OSError):
            return False
        return worker.process.is_alive()

    def _handle(self, worker: _Worker, message: tuple, pending: set[int], report) -> None:
        kind = message[0]
        if kind == "ready":
            self.log(f"worker {worker.wid} ready (pid {message[2]}, {worker.device})")
            return
        seed = message[2]
        if kind == "start":
            worker.running = seed
            return
        worker.running = None
        if seed in worker.assigned:
            worker.assigned.remove(seed)
            worker.sent -= 1
            worker.feed()
        if seed not in pending:
            return
        pending.discard(seed)
        if kind == "done":
            report(Outcome(seed, row=message[3]))
        else:
            report(Outcome(seed, error=message[3]))

    def _bury(self, worker: _Worker, pending: set[int], report) -> None:
        del self.workers[worker.wid]
        worker.process.join()
        code = worker.process.exitcode
        left = [s for s in worker.assigned if s in pending]
        where = f" while running seed {worker.running}" if worker.running in pending else ""
        note = (
            f"worker {worker.wid} (pid {worker.process.pid}, {worker.device}) died with exit"
            f" code {code}{where}; its {len(left)} unfinished seed(s) {left} go back to the pool"
        )
        self.deaths.append(note)
        self.log(f"WARNING: {note}")
        if worker.running in pending:
            seed = worker.running
            self._deaths_of_seed[seed] = self._deaths_of_seed.get(seed, 0) + 1
            if self._deaths_of_seed[seed] >= DEATHS_PER_SEED:
                left.remove(seed)
                pending.discard(seed)
                error = f"{DEATHS_PER_SEED} workers died running this seed (last exit code {code})"
                report(Outcome(seed, error=error))
        if not left:
            return
        survivors = list(self.workers.values())
        if not survivors:
            if self.max_replacements <= 0:
                for seed in left:
                    pending.discard(seed)
                    report(Outcome(seed, error="every worker died and no replacement is left"))
                return
            self.max_replacements -= 1
            survivors = [self._start(worker.device)]
            self.log(f"started replacement worker {survivors[0].wid} on {worker.device}")
        for i, seed in enumerate(left):
            survivors[i % len(survivors)].give(seed)

    def _stop_all(self) -> None:
        for worker in self.workers.values():
            with contextlib.suppress(OSError):
                worker.tasks.send(None)
        for worker in self.workers.values():
            worker.process.join(timeout=10)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
        self.workers.clear()
