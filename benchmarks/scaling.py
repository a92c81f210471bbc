"""Cost of the all-reduce timing hook and effect of gradient compression, measured side by side.

Trains the embedded short-text configuration (small model: communication-heavy) at world size 1,
then at world size 2 with the timing hook, without it, and with fp16 gradient compression, and
prints mean epoch times (warm-up excluded) and their ratios to the 1-process baseline measured in
the same run. CPU processes with gloo here; the same script runs on GPUs with NCCL.

    python benchmarks/scaling.py [--n-train 2048] [--epochs 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

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


def run(folder: Path, name: str, world: int, epochs: int, **ddp: object) -> dict:
    settings = {
        "amp": "bf16", "warmup_epochs": 1,
        "ddp": {"static_graph": True, "gradient_as_bucket_view": True, "bucket_cap_mb": 25,
                "compression": "none", "comm_timing": True, **ddp},
        "configurations": {name: {"model": MODEL, "train": {
            "epochs": epochs, "global_batch_size": 16, "per_gpu_batch_size": None,
            "accumulation_steps": 1, "learning_rate": 0.003, "weight_decay": 0.01,
            "warmup_steps": 10, "seed": 0}}},
    }  # fmt: skip
    out = folder / name
    subprocess.run(
        [str(BIN / "torchrun"), "--standalone", f"--nproc-per-node={world}", "-m", "gpuflow",
         "scaling-train", "--name", name, "--train", str(folder / "train.npz"),
         "--val", str(folder / "val.npz"), "--data-info", str(folder / "data.json"),
         "--token-stats", str(folder / "tokens.json"), "--settings", json.dumps(settings),
         "--cpu-slots", "2", "--out-json", str(out / "run.json"),
         "--out-model", str(out / "model.pt")],
        check=True, capture_output=True,
    )  # fmt: skip
    return json.loads((out / "run.json").read_text())


def epoch_seconds(record: dict) -> float:
    measured = [e["train_seconds"] for e in record["epochs"] if e["measured"]]
    return sum(measured) / len(measured)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-train", type=int, default=2048)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        prepare(folder, args.n_train)
        base = run(folder, "one", 1, args.epochs)
        variants = {
            "2 processes, timing hook": run(folder, "timed", 2, args.epochs),
            "2 processes, no hook": run(folder, "plain", 2, args.epochs, comm_timing=False),
            "2 processes, fp16 compression (timed)": run(
                folder, "fp16", 2, args.epochs, compression="fp16"
            ),
        }
    reference = epoch_seconds(base)
    print(f"device {base['device']}, {base['parameters']:,} parameters, global batch 16")
    print(f"{'run':42s} {'epoch s':>8s} {'speedup':>8s} {'comm share':>10s}")
    print(f"{'1 process (baseline)':42s} {reference:8.2f} {1.0:8.2f} {'-':>10s}")
    for label, record in variants.items():
        seconds = epoch_seconds(record)
        comm = [e["comm_seconds"] for e in record["epochs"] if e["measured"]]
        share = f"{100 * sum(comm) / len(comm) / seconds:9.1f}%" if comm[0] else f"{'-':>10s}"
        print(f"{label:42s} {seconds:8.2f} {reference / seconds:8.2f} {share}")
    timed = epoch_seconds(variants["2 processes, timing hook"])
    plain = epoch_seconds(variants["2 processes, no hook"])
    print(f"timing hook overhead: {timed / plain:.2f}x the epoch time without it")


if __name__ == "__main__":
    main()
