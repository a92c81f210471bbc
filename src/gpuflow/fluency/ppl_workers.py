"""One scoring worker per device: each loads the model on its device and scores its segments.

With several devices (all visible GPUs, or `cpu_workers` CPU slots) every worker is a spawned
process; with one, the same `run_worker` function runs in this process.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context

import torch
from tqdm import tqdm

from gpuflow.devices import threads_per_worker
from gpuflow.fluency.placement import input_device, load_sharded
from gpuflow.fluency.ppl_model import load_causal_lm
from gpuflow.fluency.ppl_scoring import Forward, SegmentScores, model_forward, score_segments
from gpuflow.fluency.ppl_segments import Segment


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
    """What one worker needs: the model, its device, its share of the sorted segments.

    `shard_over` (placement shard) names the devices one copy of the model is spread over.
    """

    model: str
    trust_remote_code: bool
    dtype: str
    device: str
    segments: list[Segment]
    token_budget: int
    threads: int
    index: int = 0
    shard_over: tuple[str, ...] = ()


def run_worker(
    job: WorkerJob, wrap_forward: Callable[[Forward], Forward] | None = None
) -> SegmentScores:
    """Load the model on the job's device and score its segments (in the order given).

    `wrap_forward` wraps the model's forward call (tests use it to inject out-of-memory errors).
    """
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
    if wrap_forward is not None:
        forward = wrap_forward(forward)
    with tqdm(
        total=sum(s.n_targets for s in job.segments),
        desc=f"perplexity worker {job.index} ({job.device})",
        unit="tok",
        unit_scale=True,
        position=job.index,
        mininterval=2.0,
        file=sys.stderr,
    ) as progress:
        return score_segments(job.segments, forward, device, job.token_budget, progress)


def run_workers(jobs: list[WorkerJob]) -> list[SegmentScores]:
    """Run every job, each in its own spawned process (in this process when there is one)."""
    if len(jobs) == 1:
        return [run_worker(jobs[0])]
    with ProcessPoolExecutor(max_workers=len(jobs), mp_context=get_context("spawn")) as pool:
        return list(pool.map(run_worker, jobs))
