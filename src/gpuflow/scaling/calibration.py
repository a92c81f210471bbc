"""Scaling rates for `gpuflow calibrate`: the classifier's training step, the all-reduce of its
gradients between processes, and the TF-IDF baseline, each at a job's shape and data.

Batches are the job's own per-process batch size, with texts of its token lengths (random ids)
padded as gpuflow.scaling.train.collate pads them; the all-reduce runs between this process and
helper processes over the job's backend, each step's gradient bytes at a time.
"""

from __future__ import annotations

import socket
import time
from typing import Any

import numpy as np

from gpuflow.cost.calibrate import Need, Trial, texts_trial
from gpuflow.scaling.layout import batch_plan
from gpuflow.scaling.work import flops_per_token, parameters, planned_tokens, train_threads

STEPS = 4  # per trial
REDUCES = 4  # per trial
MAX_REDUCE_BYTES = 64 << 20


def step_trial(need: Need) -> Trial:
    """FLOP/s (of real tokens) of one process's training step at the job's batch and threads."""
    import torch

    from gpuflow.scaling.model import build_model
    from gpuflow.scaling.train import collate

    scaling = need.config["scaling"]
    chosen = scaling["configurations"][need.wildcards["cfg"]]
    tokens = planned_tokens(chosen)
    world = int(need.wildcards.get("world") or 1)
    plan = batch_plan(chosen["train"], world)
    threads = train_threads(scaling, world)
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    device = torch.device(need.device)
    model = build_model(chosen["model"], tokens.vocab, tokens.classes).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    total, embedding = parameters(chosen["model"], tokens.vocab, tokens.classes)
    per_token = flops_per_token(chosen["model"], total - embedding)
    rng = np.random.default_rng(0)
    lengths = np.array(tokens.train)

    def batch() -> dict[str, Any]:
        picked = rng.choice(lengths, size=plan.per_gpu_batch_size)
        items = [(rng.integers(2, tokens.vocab, size=n), int(n) % 2) for n in picked]
        return collate(items, 1, chosen["model"]["max_seq_len"])

    def step(data: dict[str, Any]) -> None:
        logits = model(data["ids"].to(device), data["mask"].to(device))
        loss = torch.nn.functional.cross_entropy(logits.float(), data["labels"].to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    step(batch())

    def run() -> dict[str, float]:
        batches = [batch() for _ in range(STEPS)]
        began = time.perf_counter()
        for data in batches:
            step(data)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        real = sum(data["tokens"] for data in batches)
        return {need.term.shape: real * per_token / (time.perf_counter() - began)}

    what = f"{STEPS} steps of {plan.per_gpu_batch_size}"
    return Trial(need.term.kind, "FLOP/s", what, run, threads=threads)


def reduce_helper(rank: int, world: int, port: int, backend: str) -> None:
    """A helper rank: join the group, then all-reduce as many elements as rank 0 broadcasts
    (REDUCES times) until it broadcasts 0."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    size = torch.zeros(1, dtype=torch.long, device=device)
    while True:
        dist.broadcast(size, 0)
        if int(size) == 0:
            break
        payload = torch.ones(int(size), device=device)
        for _ in range(REDUCES):
            dist.all_reduce(payload)
    dist.destroy_process_group()


def allreduce_trial(need: Need) -> Trial | None:
    """Bytes/s of all-reducing one step's gradients over the job's backend and world (one
    node: several nodes cannot be measured on one machine)."""
    import multiprocessing

    import torch
    import torch.distributed as dist

    backend, world_part, nodes = need.term.shape.split()
    world = int(world_part[1:])
    if nodes != "n1" or (backend == "nccl" and torch.cuda.device_count() < world):
        return None
    chosen = need.config["scaling"]["configurations"][need.wildcards["cfg"]]
    tokens = planned_tokens(chosen)
    step_bytes = 4 * parameters(chosen["model"], tokens.vocab, tokens.classes)[0]
    elements = min(step_bytes, MAX_REDUCE_BYTES) // 4
    with socket.socket() as probe:  # a free port
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    context = multiprocessing.get_context("spawn")
    helpers = [
        context.Process(target=reduce_helper, args=(rank, world, port, backend), daemon=True)
        for rank in range(1, world)
    ]
    for helper in helpers:
        helper.start()
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=world
    )
    device = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")
    size = torch.tensor([elements], device=device)

    def run() -> dict[str, float]:
        dist.broadcast(size, 0)
        payload = torch.ones(elements, device=device)
        began = time.perf_counter()
        for _ in range(REDUCES):
            dist.all_reduce(payload)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return {need.term.shape: REDUCES * elements * 4 / (time.perf_counter() - began)}

    def close() -> None:
        dist.broadcast(torch.zeros(1, dtype=torch.long, device=device), 0)
        dist.destroy_process_group()
        for helper in helpers:
            helper.join(timeout=30)

    run()
    what = f"all-reduce of {elements * 4 >> 20} MB"
    return Trial(need.term.kind, "bytes/s", what, run, close, threads=1)


def baseline_trial(need: Need) -> Trial:
    """Bytes/s of fitting the baseline on a quarter of the job's training split."""
    from gpuflow.scaling.baseline import build_pipeline
    from gpuflow.scaling.data import build_splits

    scaling = need.config["scaling"]
    chosen = scaling["configurations"][need.wildcards["cfg"]]
    train, _, _ = build_splits(chosen["data"])
    part = train.iloc[: max(64, len(train) // 4)]
    texts, labels = part["text"].tolist(), part["label"].to_numpy()
    return texts_trial(
        need,
        texts,
        f"fitting on {len(texts)} texts",
        lambda: build_pipeline(scaling["baseline"]).fit(texts, labels),
    )


MEASURE = {
    "scaling.train.flop": step_trial,
    "allreduce.bytes": allreduce_trial,
    "baseline.bytes": baseline_trial,
}
