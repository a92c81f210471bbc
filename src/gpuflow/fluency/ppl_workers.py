"""One scoring worker per device: each loads the model once and scores the batches it is given."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from gpuflow.errors import ConfigError, GpuflowError
from gpuflow.fluency.placement import load_sharded
from gpuflow.fluency.ppl_model import load_causal_lm, prepare_for_scoring
from gpuflow.fluency.ppl_scoring import Forward, SegmentScores, model_forward, score_segments
from gpuflow.fluency.ppl_segments import Segment
from gpuflow.job import Done, WorkerPool, threads_per_worker

Scored = Callable[[int, SegmentScores, int], None]  # batch, its scores, the worker's id
# Dummy batch sizes no model dimension is likely to equal: dynamic shapes take sizes that are
# equal in the example for one symbol (duck sizing), and a later batch would compile again.
WARMUP_ROWS, WARMUP_LENGTH = 3, 7


def worker_threads(n_workers: int) -> int:
    """CPU threads per worker: the cores this process may use, capped by OMP_NUM_THREADS."""
    threads = threads_per_worker(n_workers)
    limit = os.environ.get("OMP_NUM_THREADS", "")
    if limit.isdigit() and int(limit) > 0:
        threads = min(threads, max(1, int(limit) // n_workers))
    return threads


def compiled_forward(model: torch.nn.Module, device: torch.device) -> tuple[Forward, float]:
    """`model`'s scoring forward through torch.compile, compiled on `device`, and its seconds."""
    started = time.perf_counter()
    forward = model_forward(torch.compile(model, dynamic=True))
    try:
        with torch.inference_mode():  # as scoring runs: the guards check for inference tensors
            ids = torch.zeros((WARMUP_ROWS, WARMUP_LENGTH), dtype=torch.long, device=device)
            forward(ids, torch.ones_like(ids, dtype=torch.bool))
            one_scored = torch.zeros((1, WARMUP_LENGTH), dtype=torch.bool, device=device)
            one_scored[0, 0] = True
            forward(ids[:1].clone(), one_scored)
    except Exception as error:  # Inductor's errors have no common base class
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ConfigError(
            "fluency.perplexity.compile",
            f"torch.compile could not compile the scoring model on {device}: {reason}",
            "false, or a C++ compiler on CPU nodes (Triton on GPUs)",
        ) from error
    return forward, time.perf_counter() - started


@dataclass(frozen=True)
class WorkerJob:
    """What each worker needs besides its device: model, CPU threads, perplexity settings."""

    model: str
    trust_remote_code: bool
    threads: int
    settings: dict[str, Any]
    shard_over: tuple[str, ...] = ()


def open_scorer(
    job: WorkerJob, device_name: str, wrap_forward: Callable[[Forward], Forward] | None = None
) -> Callable[[Sequence[Segment]], SegmentScores]:
    """In a worker: the model of `job` on `device_name`, as a function scoring a batch."""
    started = time.perf_counter()
    torch.set_num_threads(job.threads)
    device = torch.device(device_name)
    dtype = job.settings["dtype"]
    if job.shard_over:
        shard = [torch.device(d) for d in job.shard_over]
        model = load_sharded(job.model, dtype, shard, job.trust_remote_code)
        device = model.get_input_embeddings().weight.device  # where it takes its input ids
    else:
        model = load_causal_lm(job.model, dtype, device, job.trust_remote_code)
    model = prepare_for_scoring(model, job.settings["attn_implementation"])
    if job.settings["compile"]:
        forward, seconds = compiled_forward(model, device)
        print(f"perplexity worker on {device}: compiled in {seconds:.1f} s", file=sys.stderr)
    else:
        forward = model_forward(model)
    if wrap_forward is not None:
        forward = wrap_forward(forward)
    token_budget, load_seconds = job.settings["token_budget"], time.perf_counter() - started

    def score(segments: Sequence[Segment]) -> SegmentScores:
        """Scores of one batch (split further only when the device runs out of memory)."""
        nonlocal token_budget, load_seconds
        scores = score_segments(segments, forward, device, token_budget)
        token_budget = scores.token_budget
        scores.load_seconds, load_seconds = load_seconds, 0.0
        return scores

    return score


def score_batches(
    job: WorkerJob,
    devices: Sequence[str],
    batches: Sequence[Sequence[Segment]],
    todo: Sequence[int],
    on_scored: Scored,
    should_stop: Callable[[], bool],
    log: Callable[[str], None],
    wrap_forward: Callable[[Forward], Forward] | None = None,
) -> list[str]:
    """Score batches `todo` with one worker per device; one line per worker that died."""
    if wrap_forward is not None and len(devices) != 1:
        raise ValueError("wrap_forward needs exactly one worker")
    pool = WorkerPool(
        partial(open_scorer, job, wrap_forward=wrap_forward),
        devices,
        name="perplexity",
        item="batch",
        log=log,
        isolate=False,
    )

    def scored(done: Done) -> None:
        if done.error is not None:
            raise GpuflowError(f"{done.where}: {done.error}")
        on_scored(int(done.key), done.result, done.worker)

    pool.run({batch: batches[batch] for batch in todo}, scored, should_stop)
    return pool.deaths
