"""The work of a scaling run, counted from its data, tokenizer and model before it runs.

The training texts are those `gpuflow scaling-data` splits off, tokenised with the BPE tokenizer
`scaling-tokenize` trains on them (trained here the same way) and cut at max_seq_len. An epoch
trains on steps x global batch of them at 6 x dense parameters + attention FLOP per token
(gpuflow.ops.gpu_check's rows count the same), shared by the world's processes; each step of a
world above one all-reduces every gradient; after training the epoch scores the validation
split (a forward pass) and saves its state. Torch-free: the Snakefile counts it while parsed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from gpuflow.cost.work import NotHere, Term, Work, count, startup
from gpuflow.scaling.layout import batch_plan, process_threads

STATE_COPIES = 3  # weights, AdamW's two moments
PRECISION = {"bf16": "bf16", "fp16": "fp16", "none": "fp32"}  # config amp -> run.json precision


def parameters(model: dict[str, Any], vocab: int, classes: int) -> tuple[int, int]:
    """(all parameters, token embedding) of gpuflow.scaling.model.TextClassifier."""
    d, ffn, layers = model["d_model"], model["ffn_dim"], model["n_layers"]
    block = 4 * d * d + 4 * d + 2 * d * ffn + ffn + d + 4 * d  # attention, feed-forward, 2 norms
    total = vocab * d + model["max_seq_len"] * d + layers * block + 2 * d + d * classes + classes
    return total, vocab * d


def flops_per_token(model: dict[str, Any], dense: int) -> float:
    """Training FLOPs per token: 6 x non-embedding parameters + attention (6 x layers x
    sequence x d_model)."""
    return 6.0 * dense + 6.0 * model["n_layers"] * model["max_seq_len"] * model["d_model"]


def shape(model: dict[str, Any], per_process: int, precision: str, threads: int | None) -> str:
    """What a scaling step rate is measured at (`threads`: a CPU run's, None on a GPU)."""
    dims = f"d{model['d_model']} L{model['n_layers']} ffn{model['ffn_dim']}"
    cpu = f" t{threads}" if threads else ""
    return f"{dims} seq{model['max_seq_len']} b{per_process} {precision}{cpu}"


@dataclass(frozen=True)
class Tokens:
    """Token counts of a configuration's splits, as scaling-tokenize writes them."""

    train: list[int]  # tokens of each training text (cut at max_seq_len)
    val: int  # tokens of the validation split
    vocab: int  # the tokenizer's vocabulary
    classes: int


@cache
def _tokens(data_json: str, tokenizer_json: str, max_len: int) -> Tokens:
    """The splits scaling-data makes, tokenised by the tokenizer scaling-tokenize trains."""
    import numpy as np

    from gpuflow.scaling.data import build_splits
    from gpuflow.scaling.tokens import encode, train_tokenizer

    train, val, names = build_splits(json.loads(data_json))
    tokenizer = train_tokenizer(train["text"].tolist(), json.loads(tokenizer_json))
    offsets = encode(tokenizer, train["text"].tolist(), max_len)[1]
    val_offsets = encode(tokenizer, val["text"].tolist(), max_len)[1]
    lengths = np.diff(offsets).tolist()
    return Tokens(lengths, int(val_offsets[-1]), tokenizer.get_vocab_size(), len(names))


def planned_tokens(chosen: dict[str, Any]) -> Tokens:
    """The token counts of configuration `chosen` (its data, tokenizer and max_seq_len)."""
    return _tokens(
        json.dumps(chosen["data"], sort_keys=True),
        json.dumps(chosen["tokenizer"], sort_keys=True),
        chosen["model"]["max_seq_len"],
    )


def check_data_here(data: dict[str, Any]) -> None:
    """NotHere naming a configuration's data files that are not on this machine (a checked
    config names a path for every source but the embedded one: gpuflow.scaling.checks)."""
    paths = [] if data["source"] == "embedded" else [data["path"], data.get("val_path")]
    missing = [path for path in paths if path and not Path(path).exists()]
    if missing:
        raise NotHere(missing)


@dataclass(frozen=True)
class Run:
    """What one run's work depends on, before it runs (its settings and data) or after (its
    run record)."""

    model: dict[str, Any]
    total: int  # parameters
    dense: int  # parameters outside the token embedding
    epochs: int
    steps: int  # optimizer steps per epoch
    train_tokens: float  # per epoch
    val_tokens: float  # per epoch
    probes: int  # extra steps per epoch timing communication
    world: int
    nodes: int
    backend: str
    at: str  # shape of the step rate

    def work(self) -> Work:
        """Start-up, training, evaluation, state saves and, above one process, all-reduces."""
        per_token = flops_per_token(self.model, self.dense)
        per_step = self.train_tokens / max(1, self.steps)
        state = STATE_COPIES * 4 * self.total
        terms = [
            startup("gpuflow.job.gpulock"),
            startup("torch.distributed.run"),
            startup("gpuflow.scaling.train", processes=self.world, at_once=True),
            Term(
                "scaling.train.flop",
                self.epochs * (self.train_tokens + self.probes * per_step) * per_token,
                self.at,
                f"{self.epochs} epochs x {count(self.train_tokens)} tokens"
                f" x {count(per_token)}FLOP",
                self.world,
            ),
            Term(
                "scaling.train.flop",
                self.epochs * self.val_tokens * per_token / 3,
                self.at,
                f"{self.epochs} evaluations x {count(self.val_tokens)} tokens (forward)",
                self.world,
            ),
            Term(
                "state.write", self.epochs * state, "", f"{self.epochs} states of {count(state)}B"
            ),
        ]
        if self.world > 1:
            terms.append(
                Term(
                    "allreduce.bytes",
                    self.epochs * (self.steps + self.probes) * 4.0 * self.total,
                    f"{self.backend} x{self.world} n{self.nodes}",
                    f"{self.epochs} epochs x {self.steps + self.probes} steps"
                    f" x {count(4.0 * self.total)}B of gradients",
                )
            )
        return Work(tuple(terms), units=self.epochs, unit="epochs")


def planned_run(
    scaling: dict[str, Any], name: str, world: int, nodes: int, tokens: Tokens, threads: int
) -> Run:
    """One run of configuration `name` on `world` processes over `nodes` nodes."""
    chosen = scaling["configurations"][name]
    model, train = chosen["model"], chosen["train"]
    plan = batch_plan(train, world, f"scaling.configurations.{name}.train")
    steps = len(tokens.train) // plan.global_batch_size
    total, embedding = parameters(model, tokens.vocab, tokens.classes)
    on_gpu = gpu_run(scaling)
    return Run(
        model=model,
        total=total,
        dense=total - embedding,
        epochs=train["epochs"],
        steps=steps,
        train_tokens=sum(tokens.train[: steps * plan.global_batch_size]),
        val_tokens=tokens.val,
        probes=2 * scaling["ddp"]["comm_probe_steps"] if world > 1 else 0,
        world=world,
        nodes=nodes,
        backend="nccl" if on_gpu else "gloo",
        at=shape(
            model,
            plan.per_gpu_batch_size,
            PRECISION[scaling["amp"]] if on_gpu else "fp32",
            None if on_gpu else threads,
        ),
    )


def gpu_run(scaling: dict[str, Any]) -> bool:
    """Whether runs train on GPUs: their rule asks for GPUs (as the workflow's rules decide)."""
    return scaling["resources"]["scaling_train"]["gpu"] > 0 and scaling["device"] != "cpu"


def train_threads(scaling: dict[str, Any], local_world: int) -> int:
    """Torch threads of each process (`local_world` of them on its node), as
    gpuflow.scaling.train.Trainer picks them."""
    return process_threads(
        gpu_run(scaling),
        local_world,
        scaling["cpu_threads_per_process"],
        max(scaling["world_sizes"]),
    )


def train(config: dict[str, Any], wildcards: dict[str, str]) -> Work | None:
    """The work of one scaling_train (or scaling_train_multinode) job."""
    scaling = config["scaling"]
    name = wildcards["cfg"]
    chosen = scaling["configurations"][name]
    check_data_here(chosen["data"])
    world = int(wildcards.get("world") or 0)
    nodes = int(wildcards.get("nodes", 1))
    if not world:
        multinode = scaling["multinode"]
        nodes, world = multinode["nodes"], multinode["nodes"] * multinode["gpus_per_node"]
    threads = train_threads(scaling, world // nodes)
    return planned_run(scaling, name, world, nodes, planned_tokens(chosen), threads).work()


def baseline(config: dict[str, Any], wildcards: dict[str, str]) -> Work | None:
    """The work of one scaling_baseline job: TF-IDF and a linear classifier on the train split."""
    scaling = config["scaling"]
    chosen = scaling["configurations"][wildcards["cfg"]]
    check_data_here(chosen["data"])
    from gpuflow.scaling.data import build_splits

    train_split, val, _ = build_splits(chosen["data"])
    return baseline_work(scaling["baseline"], train_split["text"].tolist() + val["text"].tolist())


def baseline_work(settings: dict[str, Any], texts: list[str]) -> Work:
    """Fitting and scoring the baseline on `texts`."""
    size = sum(len(text.encode("utf-8")) for text in texts)
    at = f"{settings['classifier']} ngram{settings['ngram_max']}"
    return Work(
        (
            startup("gpuflow.scaling.baseline"),
            Term("baseline.bytes", size, at, f"{len(texts)} texts, {count(size)}B"),
        )
    )


def train_done(outputs: list[str], inputs: list[str]) -> Work | None:
    """The work a finished run did, from its run record and its token counts (tokens.json)."""
    try:
        run = json.loads(Path(outputs[0]).read_text(encoding="utf-8"))
        stats = json.loads(Path(inputs[3]).read_text(encoding="utf-8"))
        epochs = run["epochs"]
        threads = run["torch_threads_per_process"] if run["device_type"] == "cpu" else None
        return Run(
            model=run["model"],
            total=run["parameters"],
            dense=run["parameters"] - run["token_embedding_parameters"],
            epochs=len(epochs),
            steps=run["steps_per_epoch"],
            train_tokens=sum(e["tokens"] for e in epochs) / len(epochs),
            val_tokens=stats["val"]["tokens"],
            probes=2 * epochs[0].get("comm_probe_steps", 0),
            world=run["world_size"],
            nodes=run["nodes"],
            backend=run["backend"],
            at=shape(run["model"], run["per_gpu_batch_size"], run["precision"], threads),
        ).work()
    except (OSError, ValueError, KeyError, TypeError, IndexError, ZeroDivisionError):
        return None


def baseline_done(outputs: list[str], inputs: list[str]) -> Work | None:
    """The work a finished baseline did, from its input splits."""
    try:
        from gpuflow.scaling.tokens import read_split

        record = json.loads(Path(outputs[0]).read_text(encoding="utf-8"))
        texts = [t for path in inputs[:2] for t in read_split(path)["text"].tolist()]
        return baseline_work(record["settings"], texts)
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None


WORK = {"scaling_train": train, "scaling_train_multinode": train, "scaling_baseline": baseline}
DONE = {
    "scaling_train": train_done,
    "scaling_train_multinode": train_done,
    "scaling_baseline": baseline_done,
}
