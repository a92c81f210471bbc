"""One scoring worker per device: each loads the model once and scores the batches it is given.

With several devices (all visible GPUs, or `cpu_workers` CPU slots) every worker is a spawned
process and the parent deals batches as workers free up (two in hand each, so none waits);
with one, the same scoring runs in this process. Either way the caller hears of each batch as
it is scored and may stop dealing (a stop request): the batches in hand are finished first.
"""

from __future__ import annotations

import os
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing import get_context
from multiprocessing.connection import Connection, wait
from typing import Any

import torch

from gpuflow.errors import GpuflowError
from gpuflow.fluency.placement import input_device, load_sharded
from gpuflow.fluency.ppl_model import load_causal_lm
from gpuflow.fluency.ppl_scoring import Forward, SegmentScores, model_forward, score_segments
from gpuflow.fluency.ppl_segments import Segment
from gpuflow.job.devices import threads_per_worker
from gpuflow.job.stopping import leave_to_parent, started_ignoring_stops

IN_HAND = 2
POLL_S = 0.2
Scored = Callable[[int, SegmentScores, int], None]  # batch, its scores, the worker's index


def worker_threads(n_workers: int) -> int:
    """CPU threads per worker: the cores this process may use, capped by OMP_NUM_THREADS.

    Snakemake sets OMP_NUM_THREADS to the job's `threads`; honouring it keeps jobs that run side
    by side from oversubscribing the cores (which slows small models down by an order of
    magnitude).
    """
    threads = threads_per_worker(n_workers)
    limit = os.environ.get("OMP_NUM_THREADS", "")
    if limit.isdigit() and int(limit) > 0:
        threads = min(threads, max(1, int(limit) // n_workers))
    return threads


@dataclass(frozen=True)
class WorkerJob:
    """What one worker needs: the model, its device, its first token budget.

    `shard_over` (placement shard) names the devices one copy of the model is spread over.
    """

    model: str
    trust_remote_code: bool
    dtype: str
    device: str
    token_budget: int
    threads: int
    index: int = 0
    shard_over: tuple[str, ...] = ()


class Scorer:
    """A loaded model that scores batches; after out-of-memory its token budget stays lower."""

    def __init__(self, job: WorkerJob, wrap_forward: Callable[[Forward], Forward] | None = None):
        torch.set_num_threads(job.threads)
        device = torch.device(job.device)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        if job.shard_over:
            shard = [torch.device(d) for d in job.shard_over]
            model = load_sharded(job.model, job.dtype, shard, job.trust_remote_code)
            device = input_device(model)
        else:
            model = load_causal_lm(job.model, job.dtype, device, job.trust_remote_code)
        forward = model_forward(model)
        self.forward = forward if wrap_forward is None else wrap_forward(forward)
        self.device, self.token_budget = device, job.token_budget

    def score(self, segments: Sequence[Segment]) -> SegmentScores:
        """Scores of one batch (split further only when the device runs out of memory)."""
        scores = score_segments(segments, self.forward, self.device, self.token_budget)
        self.token_budget = scores.token_budget
        return scores


def _worker_main(job: WorkerJob, tasks: Any, results: Connection) -> None:
    """Score each batch received, until told to stop (None); report failures as text."""
    leave_to_parent()
    try:
        scorer = Scorer(job)
        while (message := tasks.get()) is not None:
            batch, segments = message
            results.send(("done", batch, scorer.score(segments)))
    except GpuflowError as error:
        results.send(("failed", str(error)))
    except Exception:
        results.send(("failed", traceback.format_exc(limit=4).strip()))


def score_batches(
    jobs: Sequence[WorkerJob],
    batches: Sequence[Sequence[Segment]],
    todo: Sequence[int],
    on_scored: Scored,
    should_stop: Callable[[], bool],
    wrap_forward: Callable[[Forward], Forward] | None = None,
) -> None:
    """Score batches `todo` and report each; after `should_stop()` deal no more.

    `wrap_forward` (one worker only) wraps the model's forward call, e.g. to inject errors.
    """
    if not todo:
        return
    if len(jobs) == 1:
        scorer = Scorer(jobs[0], wrap_forward)
        for batch in todo:
            if should_stop():
                return
            on_scored(batch, scorer.score(batches[batch]), 0)
        return
    if wrap_forward is not None:
        raise ValueError("wrap_forward needs exactly one worker")
    _WorkerPool(jobs).run(batches, todo, on_scored, should_stop)


class _WorkerPool:
    """Spawned workers with a task queue (its feeder thread never blocks the parent) and a
    result pipe each."""

    def __init__(self, jobs: Sequence[WorkerJob]):
        context = get_context("spawn")
        self.workers: list[tuple[WorkerJob, Any, Any, Connection]] = []
        with started_ignoring_stops():  # the workers and multiprocessing's resource tracker
            for job in jobs:
                tasks = context.Queue()
                result_recv, result_send = context.Pipe(duplex=False)
                process = context.Process(
                    target=_worker_main,
                    args=(job, tasks, result_send),
                    name=f"perplexity-worker-{job.index}",
                    daemon=True,
                )
                process.start()
                result_send.close()
                self.workers.append((job, process, tasks, result_recv))

    def run(
        self,
        batches: Sequence[Sequence[Segment]],
        todo: Sequence[int],
        on_scored: Scored,
        should_stop: Callable[[], bool],
    ) -> None:
        queue, in_hand = deque(todo), [0] * len(self.workers)

        def deal(worker: int) -> None:
            while queue and in_hand[worker] < IN_HAND:
                batch = queue.popleft()
                self.workers[worker][2].put((batch, batches[batch]))
                in_hand[worker] += 1

        try:
            for worker in range(len(self.workers)):
                deal(worker)
            while sum(in_hand):
                if should_stop():
                    queue.clear()
                handles = {}
                for worker, (_, process, _, results) in enumerate(self.workers):
                    if in_hand[worker]:
                        handles[results] = worker
                        handles[process.sentinel] = worker
                for handle in wait(list(handles), timeout=POLL_S):
                    self._receive(handles[handle], in_hand, on_scored)
                    deal(handles[handle])
        finally:
            self._stop_all()

    def _receive(self, worker: int, in_hand: list[int], on_scored: Scored) -> None:
        job, process, _, results = self.workers[worker]
        try:
            while results.poll():
                message = results.recv()
                if message[0] == "failed":
                    raise GpuflowError(
                        f"perplexity worker {job.index} ({job.device}): {message[1]}"
                    )
                in_hand[worker] -= 1
                on_scored(message[1], message[2], worker)
        except (EOFError, OSError):
            pass
        if in_hand[worker] and not process.is_alive():
            raise GpuflowError(
                f"perplexity worker {job.index} ({job.device}) died (exit code"
                f" {process.exitcode}); the chunks scored so far are saved"
            )

    def _stop_all(self) -> None:
        for _, _, tasks, _ in self.workers:
            tasks.put(None)
        for _, process, tasks, _ in self.workers:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
                process.join()
            tasks.cancel_join_thread()
            tasks.close()
