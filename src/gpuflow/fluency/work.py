"""The work of a fluency job, counted from its texts, tokenizer and model before it runs.

A perplexity shard's texts are those `gpuflow fluency-texts` selects and `fluency-split` deals
to it; each is tokenised with the LM's own tokenizer (the user's model folder, or the embedded
LM's byte-level BPE trained here as fluency-train-lm trains it) and scored as `[BOS] + tokens`,
in windows of the model's context where it is longer. Its work is 2 x parameters FLOP per id
through the model, shared by the job's workers, plus loading the model. A toxicity shard's work
is the bytes of its texts. Torch-free: the Snakefile counts it while it is parsed.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from gpuflow.cost.work import NotHere, Term, Work, count, startup
from gpuflow.data.modelref import cached_snapshot
from gpuflow.fluency.ppl_segments import windows

PERPLEXITY_STEP = "gpuflow.fluency.perplexity"
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class LM:
    """What the work of scoring with a causal LM depends on."""

    parameters: int
    context: int
    layers: int
    width: int
    vocab: int
    tokenizer: Any  # a tokenizers.Tokenizer
    model_type: str = "gpt2"  # its config's, which names the transformers module that loads it

    def shape(self, dtype: str) -> str:
        """What an LM rate is measured at."""
        return lm_shape(self.layers, self.width, self.vocab, self.context, dtype)

    def startups(self, parallel: int) -> list[Term]:
        """Imports of a scoring job on `parallel` workers: the step, then transformers' module of
        the model's type (loaded with the model), here and, with several, in each worker."""
        kind = self.model_type.replace("-", "_")
        imports = (PERPLEXITY_STEP, f"transformers.models.{kind}.modeling_{kind}")
        workers = [startup(*imports, processes=parallel, at_once=True)] if parallel > 1 else []
        return [startup(*imports), *workers]

    def forward_flops(self, ids: int, targets: int) -> float:
        """FLOPs of a forward pass over `ids` that scores `targets` of them: 2 x parameters per
        id, but the head (vocab x width, tied) only at scored positions (model_forward)."""
        head = self.vocab * self.width
        return 2.0 * (self.parameters - head) * ids + 2.0 * head * targets

    def token_counts(self, texts: list[str]) -> list[int]:
        """Tokens of each text, as `gpuflow perplexity` tokenises (no special tokens)."""
        encoded = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        return [len(encoding.ids) for encoding in encoded]


def lm_shape(layers: int, width: int, vocab: int, context: int, dtype: str) -> str:
    """What an LM rate is measured at: its layers, width, vocabulary, context and dtype."""
    return f"L{layers} d{width} V{vocab} ctx{context} {dtype}"


def gpt2_parameters(layers: int, width: int, vocab: int, context: int) -> int:
    """Parameters of a GPT-2 (tied head): embeddings, blocks (12 d^2 + 13 d), final norm."""
    return vocab * width + context * width + layers * (12 * width * width + 13 * width) + 2 * width


def safetensors_parameters(folder: Path) -> int | None:
    """Parameters stored in the folder's safetensors files (their headers), or None."""
    total = 0
    files = sorted(folder.glob("*.safetensors"))
    for path in files:
        with open(path, "rb") as handle:
            (size,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(size))
        header.pop("__metadata__", None)
        total += sum(math.prod(tensor["shape"]) for tensor in header.values())
    return total if files else None


def first(config: dict[str, Any], *names: str) -> int | None:
    """The first of `names` the model config sets to an integer."""
    values = [config.get(name) for name in names]
    return next((v for v in values if isinstance(v, int) and not isinstance(v, bool)), None)


@cache
def folder_lm(reference: str) -> LM | None:
    """The LM of a model folder or cached model id, from its config, weights' headers and
    tokenizer.json; None where they are not on this machine."""
    folder = Path(reference).expanduser()
    if not (folder / "config.json").is_file():
        folder = cached_snapshot(reference) or folder
    if not (folder / "config.json").is_file() or not (folder / "tokenizer.json").is_file():
        return None
    from tokenizers import Tokenizer

    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    context = first(config, "n_positions", "max_position_embeddings", "n_ctx", "seq_length")
    layers = first(config, "n_layer", "num_hidden_layers") or 0
    width = first(config, "n_embd", "hidden_size") or 0
    vocab = first(config, "vocab_size") or 0
    parameters = safetensors_parameters(folder)
    if parameters is None and config.get("model_type") == "gpt2" and context:
        parameters = gpt2_parameters(layers, width, vocab, context)
    if not (parameters and context):
        return None
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    model_type = str(config.get("model_type") or "gpt2")
    return LM(parameters, context, layers, width, vocab, tokenizer, model_type)


def embedded_lm(train: dict[str, Any], scored: tuple[str, ...]) -> LM:
    """The embedded LM fluency-train-lm will train with settings `train` (`fluency.lm.train`):
    its tokenizer trained here the same way on the same reviews (those not `scored`), its
    parameters from its shape. Trained once per settings and texts."""
    return _embedded_lm(json.dumps(train, sort_keys=True), scored)


@cache
def _embedded_lm(train_json: str, scored: tuple[str, ...]) -> LM:
    from gpuflow.fluency.lm_tokens import train_bpe, training_texts

    train = json.loads(train_json)
    texts = training_texts(list(scored), train["n_texts"], train["seed"])
    tokenizer = train_bpe(texts, train["vocab_size"])
    vocab = tokenizer.get_vocab_size()
    layers, width, context = train["n_layer"], train["n_embd"], train["n_positions"]
    return LM(
        gpt2_parameters(layers, width, vocab, context), context, layers, width, vocab, tokenizer
    )


@cache
def _texts(texts_json: str, shards: int) -> tuple[tuple[tuple[str, ...], ...], tuple[str, ...]]:
    """(each shard's texts, the original texts the embedded LM must not train on)."""
    from gpuflow.fluency.texts import deal_into_shards, selected_texts

    frame = selected_texts(json.loads(texts_json))
    originals = frame.loc[frame["condition"] != "shuffled", "text"].tolist()
    dealt = tuple(tuple(shard["text"].tolist()) for shard in deal_into_shards(frame, shards))
    return dealt, tuple(originals)


def missing_texts(fluency: dict[str, Any]) -> list[str]:
    """The text files of fluency.texts that are not on this machine."""
    texts = fluency["texts"]
    files = texts["files"] if texts["source"] == "files" else []
    return [name for name in files if not Path(name).is_file()]


def shard_texts(fluency: dict[str, Any], shard: int) -> tuple[list[str], tuple[str, ...]]:
    """The texts of one shard and the scored originals (NotHere where text files are absent)."""
    texts = fluency["texts"]
    if missing := missing_texts(fluency):
        raise NotHere(missing)
    dealt, originals = _texts(json.dumps(texts, sort_keys=True), fluency["perplexity"]["shards"])
    return list(dealt[shard]), originals


def workers(fluency: dict[str, Any], rule: str) -> int:
    """Scoring workers of a job: its GPUs on a GPU, else config cpu_workers."""
    gpus = fluency["resources"][rule]["gpu"]
    return gpus if gpus and fluency["device"] != "cpu" else fluency["cpu_workers"]


def ids_through(token_counts: list[int], context: int, stride: int | None) -> int:
    """Ids through the model when texts of `token_counts` tokens are scored as [BOS] + tokens
    in windows of `context` advancing by `stride` (half the context when None)."""
    step = context // 2 if stride is None else stride
    return sum(end - begin for n in token_counts for begin, end, _ in windows(n + 1, context, step))


def planned_lm(fluency: dict[str, Any], shard: int) -> tuple[LM, list[int]]:
    """The LM a perplexity job scores with and the token counts of its shard's texts (NotHere
    naming the text files and the model that are not on this machine)."""
    path = fluency["lm"]["path"]
    lm = folder_lm(path) if path else None
    unreadable = [f"model {path!r}"] if path and lm is None else []
    if missing := missing_texts(fluency) + unreadable:
        raise NotHere(missing)
    texts, originals = shard_texts(fluency, shard)
    lm = lm or embedded_lm(fluency["lm"]["train"], originals)
    return lm, lm.token_counts(texts)


def perplexity(config: dict[str, Any], wildcards: dict[str, str]) -> Work:
    """The work of one perplexity shard: loading the model, then its texts' ids through it on
    the job's workers."""
    fluency = config["fluency"]
    lm, token_counts = planned_lm(fluency, int(wildcards["shard"]))
    dtype, parallel = fluency["perplexity"]["dtype"], workers(fluency, "fluency_perplexity")
    model_bytes = lm.parameters * DTYPE_BYTES.get(dtype, 4)
    ids = ids_through(token_counts, lm.context, fluency["perplexity"]["stride"])
    tokens = sum(token_counts)
    return Work(
        (
            *lm.startups(parallel),
            Term("lm.load", model_bytes, "", f"load {count(model_bytes)}B of weights"),
            Term(
                "lm.forward.flop",
                lm.forward_flops(ids, tokens),
                lm.shape(dtype),
                f"{count(ids)} ids through a {count(lm.parameters)}-parameter model"
                f" ({len(token_counts)} texts, {count(tokens)} tokens)",
                parallel,
            ),
        ),
    )


def toxicity_work(scorer: str, texts: list[str]) -> Work:
    """Scoring the toxicity of `texts` with `scorer`."""
    size = sum(len(text.encode("utf-8")) for text in texts)
    return Work(
        (
            startup("gpuflow.fluency.toxicity", "profanity_check"),
            Term("toxicity.bytes", size, scorer, f"{len(texts)} texts, {count(size)}B"),
        )
    )


def toxicity(config: dict[str, Any], wildcards: dict[str, str]) -> Work:
    """The work of one toxicity shard."""
    fluency = config["fluency"]
    texts = shard_texts(fluency, int(wildcards["shard"]))[0]
    return toxicity_work(fluency["toxicity"]["scorer"], texts)


def train_lm(config: dict[str, Any], wildcards: dict[str, str]) -> Work:
    """The work of training the embedded LM: its tokenizer, then steps x batch x context tokens
    at 6 x parameters FLOP each."""
    fluency = config["fluency"]
    train = fluency["lm"]["train"]
    lm = embedded_lm(train, shard_texts(fluency, 0)[1])
    tokens = train["steps"] * train["batch_size"] * lm.context
    return Work(
        (
            startup("gpuflow.fluency.train_lm"),
            Term(
                "lm.train.flop",
                6.0 * lm.parameters * tokens,
                lm.shape("float32"),
                f"{train['steps']} steps x {train['batch_size']} x {lm.context} tokens",
            ),
        ),
        units=1,
    )


def perplexity_done(run: dict[str, Any]) -> Work | None:
    """The work a finished perplexity shard did, from its run record (and its model)."""
    lm = folder_lm(str(run["model"]))
    if lm is None or "ids" not in run:
        return None
    parallel = len(run.get("devices") or [1])
    flops = lm.forward_flops(run["ids"], run["tokens"])
    return Work(
        (
            *lm.startups(parallel),
            Term("lm.load", lm.parameters * DTYPE_BYTES.get(run["dtype"], 4), ""),
            Term("lm.forward.flop", flops, lm.shape(run["dtype"]), "", parallel),
        )
    )


def done(rule: str):
    """The work a finished job of `rule` did, from its outputs and inputs (None if unreadable)."""

    def work(outputs: list[str], inputs: list[str]) -> Work | None:
        try:
            run = json.loads(Path(outputs[1]).read_text(encoding="utf-8"))
            if rule == "fluency_perplexity":
                return perplexity_done(run)
            from gpuflow.fluency.texts import read_texts

            texts = read_texts(inputs[0])["text"].tolist()
            scorer = "profanity-check" if "profanity" in str(run["scorer"]) else "huggingface"
            return toxicity_work(scorer, texts)
        except (OSError, ValueError, KeyError, IndexError):
            return None

    return work


WORK = {
    "fluency_perplexity": perplexity,
    "fluency_toxicity": toxicity,
    "fluency_train_lm": train_lm,
}
DONE = {
    "fluency_perplexity": done("fluency_perplexity"),
    "fluency_toxicity": done("fluency_toxicity"),
}
