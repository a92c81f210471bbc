"""DDP timed with overlap on against the old hook-timed epochs, and exposed vs total all-reduce.

Trains the embedded short-text configuration (small model: communication-heavy) at world size 1,
then at world size 2 three ways, all in one run: as gpuflow trains now (DDP's all-reduce
overlapping the backward pass; communication measured apart: total and exposed), with the old
timing hook that waits for every bucket (what gpuflow timed before: overlap off), and with fp16
gradient compression. Prints mean epoch times (warm-up excluded), each speedup against the
1-process baseline measured in the same run, the ratio of the two speedups, and the exposed and
total all-reduce per step. CPU processes with gloo here; the same script runs on GPUs with NCCL.

    python benchmarks/scaling.py [--n-train 2048] [--epochs 3]
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from gpuflow.settings.blocks import family_settings, split_json

BIN = Path(sys.executable).parent
MODEL = {
    "d_model": 48,
    "n_heads": 2,
    "n_layers": 1,
    "ffn_dim": 96,
    "max_seq_len": 48,
    "dropout": 0.1,
}


def step(*args: str) -> None:
    subprocess.run([str(BIN / "gpuflow"), *args], check=True, capture_output=True)


def prepare(folder: Path, n_train: int) -> None:
    data = {
        "source": "embedded", "corpus": "rotten_tomatoes", "path": None, "val_path": None,
        "n_train": n_train, "n_val": 256, "val_fraction": 0.1, "seed": 0,
    }  # fmt: skip
    files = {name: str(folder / name) for name in ("train.csv", "val.csv", "data.json")}
    short = {"data": data, "tokenizer": {"vocab_size": 8000, "lowercase": True},
             "model": {"max_seq_len": 48}}  # fmt: skip
    settings = json.dumps({"configurations": {"short": short}})
    step("scaling-data", "--name", "short", "--settings", settings,
         "--out-train", files["train.csv"], "--out-val", files["val.csv"],
         "--out-info", files["data.json"])  # fmt: skip
    step(
        "scaling-tokenize", "--name", "short", "--settings", settings,
        "--train", files["train.csv"], "--val", files["val.csv"],
        "--out-tokenizer", str(folder / "tok.json"), "--out-train", str(folder / "train.npz"),
        "--out-val", str(folder / "val.npz"), "--out-stats", str(folder / "tokens.json"),
    )  # fmt: skip


def settings(name: str, epochs: int, **ddp: object) -> dict[str, Any]:
    """config['scaling'] for one configuration `name` (schema defaults fill the rest)."""
    return {
        "amp": "bf16", "warmup_epochs": 1,
        "ddp": {"static_graph": True, "gradient_as_bucket_view": True, "bucket_cap_mb": 25,
                "compression": "none", "comm_probe_steps": 8, **ddp},
        "configurations": {name: {"model": MODEL, "train": {
            "epochs": epochs, "global_batch_size": 16, "per_gpu_batch_size": None,
            "accumulation_steps": 1, "learning_rate": 0.003, "weight_decay": 0.01,
            "warmup_steps": 10, "seed": 0}}},
    }  # fmt: skip


def train_args(folder: Path, name: str, config: dict[str, Any]) -> list[str]:
    out = folder / name
    return [
        "--name", name, "--train", str(folder / "train.npz"), "--val", str(folder / "val.npz"),
        "--data-info", str(folder / "data.json"), "--token-stats", str(folder / "tokens.json"),
        "--settings", split_json("scaling", config, "results"),
        "--runtime", split_json("scaling", config, "runtime"), "--cpu-slots", "2",
        "--out-json", str(out / "run.json"), "--out-model", str(out / "model.pt"),
    ]  # fmt: skip


def run(folder: Path, name: str, world: int, epochs: int, **ddp: object) -> dict:
    """A gpuflow scaling-train run, as the workflow starts it."""
    command = [
        "-m",
        "gpuflow",
        "scaling-train",
        *train_args(folder, name, settings(name, epochs, **ddp)),
    ]
    subprocess.run(
        [str(BIN / "torchrun"), "--standalone", f"--nproc-per-node={world}", *command],
        check=True, capture_output=True,
    )  # fmt: skip
    return json.loads((folder / name / "run.json").read_text())


def run_hook_timed(folder: Path, epochs: int) -> dict:
    """The old measurement: the same run with a hook that waits for every bucket's all-reduce."""
    command = [__file__, "--hook-worker", *train_args(folder, "hook", settings("hook", epochs))]
    subprocess.run(
        [str(BIN / "torchrun"), "--standalone", "--nproc-per-node=2", *command],
        check=True, capture_output=True,
    )  # fmt: skip
    return json.loads((folder / "hook" / "run.json").read_text())


class HookTimer:
    """Seconds spent inside the waiting all-reduce hook, and how many buckets went through it."""

    def __init__(self, group: Any):
        self.group, self.seconds, self.calls = group, 0.0, 0


def waiting_allreduce_hook(
    state: HookTimer, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP's all-reduce, waited for inside the hook: no bucket overlaps the backward pass."""
    start = time.perf_counter()
    future = default_hooks.allreduce_hook(state.group, bucket)
    future.wait()
    state.seconds += time.perf_counter() - start
    state.calls += 1
    return future


def hook_worker(argv: list[str]) -> None:
    """One torchrun worker of the hook-timed run: gpuflow's Trainer with the waiting hook."""
    from gpuflow.job.atomic import write_json
    from gpuflow.scaling import distributed
    from gpuflow.scaling.train import RunFiles, Trainer, results_part, run_settings

    parser = argparse.ArgumentParser()
    for flag in ("name", "train", "val", "data-info", "token-stats", "settings", "runtime",
                 "out-json", "out-model"):  # fmt: skip
        parser.add_argument(f"--{flag}", required=True)
    parser.add_argument("--cpu-slots", type=int, required=True)
    args = parser.parse_args(argv)
    scaling = family_settings("scaling", args.settings, args.runtime)
    scaling["ddp"]["comm_probe_steps"] = 0  # the hook measures; no probe on top
    config = run_settings(scaling, args.name)
    ctx = distributed.init(config["device"])
    try:
        trainer = Trainer(ctx, RunFiles.of(args), config, results_part(scaling, args.name))
        timer = HookTimer(dist.group.WORLD)
        trainer.ddp.register_comm_hook(timer, waiting_allreduce_hook)
        trainer.fit()
        result = trainer.result()
        result["hook_ms_per_call"] = 1000 * timer.seconds / max(1, timer.calls)
        if ctx.rank == 0:
            write_json(args.out_json, result)
    finally:
        dist.destroy_process_group()


def epoch_seconds(record: dict) -> float:
    measured = [e["train_seconds"] for e in record["epochs"] if e["measured"]]
    return sum(measured) / len(measured)


def measured(record: dict, key: str) -> float:
    values = [e[key] for e in record["epochs"] if e["measured"]]
    return sum(values) / len(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-train", type=int, default=2048)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        prepare(folder, args.n_train)
        base = run(folder, "one", 1, args.epochs)
        overlap = run(folder, "overlap", 2, args.epochs)
        hooked = run_hook_timed(folder, args.epochs)
        fp16 = run(folder, "fp16", 2, args.epochs, compression="fp16")
    reference = epoch_seconds(base)
    print(f"device {base['device']}, {base['parameters']:,} parameters, global batch 16, "
          f"{base['steps_per_epoch']} steps per epoch")  # fmt: skip
    print(f"{'run':44s} {'epoch s':>8s} {'speedup':>8s} {'exposed ms':>10s} {'total ms':>9s}")
    print(f"{'1 process (baseline)':44s} {reference:8.2f} {1.0:8.2f} {'-':>10s} {'-':>9s}")
    for label, record in (("2 processes, overlap on (gpuflow now)", overlap),
                          ("2 processes, fp16 compression, overlap on", fp16)):  # fmt: skip
        seconds = epoch_seconds(record)
        exposed, total = measured(record, "comm_exposed_ms"), measured(record, "comm_total_ms")
        print(f"{label:44s} {seconds:8.2f} {reference / seconds:8.2f} {exposed:10.1f} "
              f"{total:9.1f}")  # fmt: skip
    hook_seconds = epoch_seconds(hooked)
    print(f"{'2 processes, waiting hook (old timing)':44s} {hook_seconds:8.2f} "
          f"{reference / hook_seconds:8.2f} {'-':>10s} {hooked['hook_ms_per_call']:9.1f}"
          "  (hook-timed all-reduce per bucket)")  # fmt: skip
    speedup_overlap = reference / epoch_seconds(overlap)
    speedup_hook = reference / hook_seconds
    print(f"speedup with overlap on / hook-timed speedup: {speedup_overlap / speedup_hook:.2f}x")
    exposed, total = measured(overlap, "comm_exposed_ms"), measured(overlap, "comm_total_ms")
    print(
        f"exposed / total all-reduce per step (overlap on): {exposed:.1f} / {total:.1f} ms "
        f"= {exposed / total:.2f}"
    )


if __name__ == "__main__":
    if "--hook-worker" in sys.argv:
        hook_worker([a for a in sys.argv[1:] if a != "--hook-worker"])
    else:
        main()
