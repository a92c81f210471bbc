"""Scaling rows: DDP training through `torchrun -m gpuflow scaling-train`, as the workflow runs it.

A fp32 run at world size 1 is the reference; the AMP run (bf16 on GPUs, NCCL) and every larger
world size the visible GPUs allow must reach the same validation accuracy and a close loss.
Data are seeded synthetic token ids whose label shows in which half of the vocabulary most
tokens fall, so that the model learns within two short epochs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.gpu_check.rows import CheckRow
from gpuflow.errors import GpuflowError
from gpuflow.scaling.tokens import save_encoded
from gpuflow.scaling.work import flops_per_token
from gpuflow.scaling.work import shape as scaling_shape
from gpuflow.settings.blocks import split_json

ACCURACY_TOLERANCE = 0.05
LOSS_TOLERANCE = 0.15


def write_synthetic_split(path: Path, n: int, max_len: int, vocab: int, seed: int) -> None:
    """`n` encoded texts: 2 classes, 3 in 4 tokens from the class's half of the vocabulary."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, size=n)
    lengths = rng.integers(max_len // 2, max_len + 1, size=n)
    texts = []
    for label, length in zip(labels, lengths, strict=True):
        half = rng.integers(label * vocab // 2, (label + 1) * vocab // 2, size=length)
        anywhere = rng.integers(0, vocab, size=length)
        texts.append(np.where(rng.random(length) < 0.75, half, anywhere))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    save_encoded(path, np.concatenate(texts).astype(np.int32), offsets, labels)


def write_inputs(folder: Path, sizes: dict[str, Any]) -> dict[str, Path]:
    """The encoded splits, data info and token stats a scaling-train run reads."""
    (configuration,) = sizes["settings"]["configurations"].values()  # a gpu-check config has one
    vocab = sizes["vocab_size"]
    max_len = configuration["model"]["max_seq_len"]
    n_train = sizes["steps"] * configuration["train"]["global_batch_size"]
    paths = {name: folder / f"{name}.npz" for name in ("train", "val")}
    write_synthetic_split(paths["train"], n_train, max_len, vocab, seed=0)
    write_synthetic_split(paths["val"], sizes["n_val"], max_len, vocab, seed=1)
    paths["info"] = folder / "data_info.json"
    paths["info"].write_text(json.dumps({"n_classes": 2}))
    paths["stats"] = folder / "token_stats.json"
    paths["stats"].write_text(json.dumps({"vocab_size": vocab}))
    return paths


def torchrun(
    folder: Path, inputs: dict[str, Path], settings: dict[str, Any], world: int, name: str
):
    """Run one training with torchrun (the workflow's command line); return its run record.

    `settings` is a config['scaling'] with one configuration; `name` names the run's files.
    """
    out = folder / f"{name}.json"
    (configuration_name,) = settings["configurations"]
    options = {
        "--name": configuration_name,
        "--train": inputs["train"],
        "--val": inputs["val"],
        "--data-info": inputs["info"],
        "--token-stats": inputs["stats"],
        "--settings": split_json("scaling", settings, "results"),
        "--runtime": split_json("scaling", settings, "runtime"),
        "--cpu-slots": world,
        "--out-json": out,
        "--out-model": folder / f"{name}.pt",
    }
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command = [*launcher, f"--nproc-per-node={world}", "-m", "gpuflow", "scaling-train"]
    command += [str(word) for option in options.items() for word in option]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise GpuflowError(
            f"scaling-train {name} failed ({done.returncode}): {done.stderr[-1500:]}"
        )
    return json.loads(out.read_text())


def scaling_rows(
    folder: Path, sizes: dict[str, Any], worlds: list[int], peaks: dict[str, float]
) -> list[CheckRow]:
    """fp32 reference at world 1, then the AMP run at world 1 and every larger world size."""
    inputs = write_inputs(folder, sizes)
    settings = sizes["settings"]
    reference = torchrun(folder, inputs, {**settings, "amp": "none"}, 1, "fp32_world1")
    rows = [scaling_row(reference, reference, "fp32 reference", peaks)]
    for world in worlds:
        record = torchrun(folder, inputs, settings, world, f"amp_world{world}")
        rows.append(scaling_row(record, reference, f"{settings['amp']} AMP", peaks))
    return rows


def scaling_row(
    record: dict[str, Any], reference: dict[str, Any], label: str, peaks: dict[str, float]
) -> CheckRow:
    """A training row: last-epoch tokens/s, its FLOP share, accuracy and loss vs the reference."""
    last, ref = record["epochs"][-1], reference["epochs"][-1]
    accuracy_gap = abs(last["val_accuracy"] - ref["val_accuracy"])
    loss_gap = abs(last["val_loss"] - ref["val_loss"]) / max(ref["val_loss"], 1e-3)
    dtype = {"bf16": "bfloat16", "fp16": "float16"}.get(record["precision"], "float32")
    per_gpu_tokens = last["tokens_per_second"] / record["world_size"]
    dense = record["parameters"] - record["token_embedding_parameters"]
    shape = scaling_shape(
        record["model"],
        record["per_gpu_batch_size"],
        record["precision"],
        record["torch_threads_per_process"] if record["device_type"] == "cpu" else None,
    )
    return CheckRow(
        path=f"scaling DDP {label}, world {record['world_size']} "
        f"({record['backend']}, {record['precision']})",
        ok=bool(accuracy_gap <= ACCURACY_TOLERANCE and loss_gap <= LOSS_TOLERANCE),
        tolerance=f"|val accuracy gap| <= {ACCURACY_TOLERANCE}, relative val loss gap <= "
        f"{LOSS_TOLERANCE} vs fp32 world 1",
        deviation=f"accuracy {accuracy_gap:.3f}, loss {loss_gap:.3f}",
        throughput=last["tokens_per_second"],
        unit="tokens/s",
        tflops=per_gpu_tokens * flops_per_token(record["model"], dense) / 1e12,
        peak_tflops=peaks[dtype],
        seconds=last["train_seconds"],
        devices=sorted({r["devices"][0] for r in record["ranks"] if r["devices"]}),
        extra={
            "val_accuracy": round(last["val_accuracy"], 4),
            "parameters": record["parameters"],
            "comm_exposed_ms": round(last["comm_exposed_ms"], 3),
            "comm_total_ms": round(last["comm_total_ms"], 3),
            "peak_memory_mb": round(last["peak_memory_mb"], 1),
            "tokens_per_second_vs_fp32": round(
                last["tokens_per_second"] / ref["tokens_per_second"], 3
            ),
            "padded_length_multiple": record["padded_length_multiple"],
        },
    ).rated("scaling.train.flop", shape)
