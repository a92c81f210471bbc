"""The one worker pool (gpuflow.job.workers): a process per device, items handed out as workers
free up, a dead worker's items handed to the others, errors reported with their item, and stop
signals left to the parent, which decides once.

The workers run `work_on` below (spawned processes import this module); each item is an
(action, n) pair and its result is n * n whatever happened on the way.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from gpuflow.errors import GpuflowError
from gpuflow.job.workers import Done, WorkerPool

WAIT_S = 20.0  # the longest a blocked item waits for the test


@pytest.fixture(autouse=True)
def deadline() -> Iterator[None]:
    """A pool that loses an item would wait for it forever: fail the test after 60 s instead."""

    def expired(signum: int, frame: Any) -> None:
        raise TimeoutError("the pool did not finish within 60 s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def work_on(folder: str, device: str) -> Callable[[tuple[str, int]], int]:
    """In a worker: the function each item runs, with its side effects in `folder`."""
    files = Path(folder)

    def run(item: tuple[str, int]) -> int:
        action, n = item
        (files / f"started-{n}").touch()
        if action == "wait-for-release":
            _wait_for(files / "release")
        elif action == "slow":
            time.sleep(0.3)
        elif action == "hang-once" and not (files / f"pid-{n}").exists():
            (files / f"pid-{n}.tmp").write_text(str(os.getpid()))
            (files / f"pid-{n}.tmp").rename(files / f"pid-{n}")
            time.sleep(WAIT_S)
        elif action == "raise":
            raise ValueError(f"bad item {n}")
        return n * n

    return run


def cannot_start(device: str) -> Callable[[Any], Any]:
    raise GpuflowError("no model in this folder")


def pool_of(tmp_path: Path, workers: int, **kwargs: Any) -> WorkerPool:
    return WorkerPool(
        partial(work_on, str(tmp_path)),
        ["cpu"] * workers,
        name="test",
        log=lambda _: None,
        **kwargs,
    )


def kill_when_hanging(tmp_path: Path, n: int) -> threading.Thread:
    """A thread that SIGKILLs the worker hanging on item `n` (started; join it)."""

    def kill() -> None:
        _wait_for(tmp_path / f"pid-{n}")
        os.kill(int((tmp_path / f"pid-{n}").read_text()), signal.SIGKILL)

    thread = threading.Thread(target=kill)
    thread.start()
    return thread


def run_all(pool: WorkerPool, work: dict[int, Any], **kwargs: Any) -> dict[int, Done]:
    done: dict[int, Done] = {}
    pool.run(work, lambda d: done.__setitem__(d.key, d), **kwargs)
    return done


def test_items_go_to_the_worker_that_is_free_not_to_a_busy_one(tmp_path):
    work = {0: ("wait-for-release", 0), **{n: ("quick", n) for n in range(1, 10)}}
    pool = pool_of(tmp_path, workers=2)
    done: list[int] = []

    def report(d: Done) -> None:
        done.append(d.key)
        if set(done) == set(work) - {0, 2}:  # worker 0 holds item 0 and item 2, in hand
            (tmp_path / "release").touch()

    started = time.monotonic()
    pool.run(work, report)
    assert set(done[-2:]) == {0, 2}, "the free worker ran every other item meanwhile"
    assert time.monotonic() - started < WAIT_S, "nothing waited on the busy worker"


def test_a_killed_workers_item_goes_to_another_and_every_result_is_the_same(tmp_path):
    work = {0: ("hang-once", 0), **{n: ("quick", n) for n in range(1, 6)}}
    pool = pool_of(tmp_path, workers=2)
    killer = kill_when_hanging(tmp_path, 0)
    done = run_all(pool, work)
    killer.join()
    assert {k: d.result for k, d in done.items()} == {n: n * n for n in work}
    assert all(d.error is None for d in done.values())
    assert len(pool.deaths) == 1
    assert re.match(
        r"worker 0 \(pid \d+, cpu\) died with exit code -9 while running item 0", pool.deaths[0]
    ), pool.deaths


def test_a_lone_worker_that_dies_is_replaced_on_its_device(tmp_path):
    lines: list[str] = []
    pool = WorkerPool(partial(work_on, str(tmp_path)), ["cpu"], name="test", log=lines.append)
    work = {0: ("hang-once", 0), 1: ("quick", 1)}
    killer = kill_when_hanging(tmp_path, 0)
    done = run_all(pool, work)
    killer.join()
    assert {k: d.result for k, d in done.items()} == {0: 0, 1: 1}
    assert "started replacement worker 1 on cpu" in lines


@pytest.mark.parametrize("workers, isolate", [(2, True), (1, False)], ids=["spawned", "here"])
def test_an_item_that_raises_is_reported_with_its_error_and_the_others_go_on(
    tmp_path, workers, isolate
):
    work = {n: ("raise" if n == 2 else "quick", n) for n in range(5)}
    done = run_all(pool_of(tmp_path, workers, isolate=isolate), work)
    assert done[2].result is None and "ValueError: bad item 2" in (done[2].error or "")
    assert done[2].where.startswith("test worker ")
    assert {k: d.result for k, d in done.items() if k != 2} == {0: 0, 1: 1, 3: 9, 4: 16}


def test_one_device_without_isolation_runs_in_this_process_and_stops_between_items():
    pool = WorkerPool(lambda device: lambda item: os.getpid(), ["cpu"], name="t", isolate=False)
    assert run_all(pool, {0: None, 1: None}, should_stop=lambda: True) == {}
    done = run_all(pool, {0: None, 1: None})
    assert {d.result for d in done.values()} == {os.getpid()}


def test_a_worker_that_cannot_start_is_an_error_naming_it(tmp_path):
    pool = WorkerPool(cannot_start, ["cpu"], name="test", log=lambda _: None)
    with pytest.raises(GpuflowError, match=r"test worker 0 \(cpu\) could not start: no model"):
        pool.run({0: None}, lambda d: None)


def test_workers_ignore_stop_signals_and_the_parent_stops_once_after_the_running_items(
    tmp_path,
):
    work = {n: ("wait-for-release", n) for n in range(6)}
    pool = pool_of(tmp_path, workers=2)  # worker 0 holds items 0 and 2, worker 1 items 1 and 3
    asked, stopping, signalled = threading.Event(), threading.Event(), []

    def slurm() -> None:
        _wait_for(tmp_path / "started-0")
        _wait_for(tmp_path / "started-1")
        for pid in pool.pids():  # as SLURM does: every process of the job gets the signals
            for signum in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
                os.kill(pid, signum)
            signalled.append(pid)
        asked.set()
        stopping.wait(WAIT_S)
        time.sleep(1.0)  # the parent has told its workers to stop by now, however busy
        (tmp_path / "release").touch()

    def should_stop() -> bool:
        if asked.is_set():
            stopping.set()
        return asked.is_set()

    thread = threading.Thread(target=slurm)
    thread.start()
    done = run_all(pool, work, should_stop=should_stop)
    thread.join()
    assert len(signalled) == 2 and pool.deaths == [], "the workers outlived the signals"
    assert {k: d.result for k, d in done.items()} == {0: 0, 1: 1}, "the running items finished"
    started = {int(p.name.split("-")[1]) for p in tmp_path.glob("started-*")}
    assert started == {0, 1}, "no worker started an item it held after the stop"
    for pid in signalled:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
