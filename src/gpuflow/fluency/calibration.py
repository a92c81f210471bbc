"""Fluency rates for `gpuflow calibrate`: the scorer, trainer, model loading and toxicity
scorer the jobs run, at the job's model shape and on texts of the job's token lengths.

The LM is the user's model where the config names one, else a randomly initialised GPT-2 of
the embedded LM's shape (its cost does not depend on its weights); token ids are random, with
the lengths the job's texts have under the LM's tokenizer.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from gpuflow.cost.calibrate import Need, Trial, texts_trial
from gpuflow.fluency.work import DTYPE_BYTES, LM, planned_lm, shard_texts

TRIAL_S = 0.4  # aim of one scoring trial
SLOW_STEP_S = 5.0  # a training step this slow is timed once per trial (GPT-2-large's on a CPU: 30)
BOS = 0


def random_gpt2(fluency: dict[str, Any], lm: LM, **extra: Any) -> Any:
    """A GPT2LMHeadModel of the embedded LM's shape, initialised from seed 0."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=lm.layers,
        n_embd=lm.width,
        n_head=fluency["lm"]["train"]["n_head"],
        vocab_size=lm.vocab,
        n_positions=lm.context,
        bos_token_id=BOS,
        eos_token_id=BOS,
        **extra,
    )
    return GPT2LMHeadModel(config)


def model_folder(fluency: dict[str, Any], lm: LM, into: Path) -> str:
    """The user's model folder, else a random GPT-2 of the embedded LM's shape saved `into`."""
    if fluency["lm"]["path"]:
        return str(fluency["lm"]["path"])
    random_gpt2(fluency, lm).save_pretrained(into)
    return str(into)


def forward_trial(need: Need) -> Trial:
    """FLOP/s of the job's scorer: its model in its dtype, batched by its token budget."""
    import torch

    from gpuflow.fluency.perplexity import check_stride
    from gpuflow.fluency.ppl_model import load_causal_lm
    from gpuflow.fluency.ppl_scoring import model_forward, score_segments
    from gpuflow.fluency.ppl_segments import make_segments, sort_longest_first

    fluency = need.config["fluency"]
    lm, counts = planned_lm(fluency, int(need.wildcards["shard"]))
    settings = fluency["perplexity"]
    stride = check_stride(settings["stride"], lm.context)
    device = torch.device(need.device)
    with tempfile.TemporaryDirectory() as folder:
        model = load_causal_lm(model_folder(fluency, lm, Path(folder)), settings["dtype"], device)
    forward = model_forward(model)
    rng = np.random.default_rng(0)
    token_ids = [rng.integers(1, lm.vocab, size=n).tolist() for n in counts]
    segments = sort_longest_first(make_segments(token_ids, BOS, lm.context, stride))
    step = max(1, len(segments) // 16)
    chosen = segments[::step]  # every length class of the shard, longest first

    def score(part: list[Any]) -> float:
        began = time.perf_counter()
        score_segments(part, forward, device, settings["token_budget"])
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - began

    per_pass = score(chosen)
    repeats = max(1, round(TRIAL_S / max(per_pass, 1e-3)))
    ids = sum(len(s.ids) for s in chosen)
    flops = lm.forward_flops(ids, sum(s.n_targets for s in chosen))

    def run() -> dict[str, float]:
        seconds = sum(score(chosen) for _ in range(repeats))
        return {need.term.shape: repeats * flops / seconds}

    return Trial(need.term.kind, "FLOP/s", f"scoring {len(chosen)} windows x {repeats}", run)


def train_trial(need: Need) -> Trial:
    """FLOP/s of the embedded LM's training step (AdamW, clipped gradients) at its shape."""
    import torch

    fluency = need.config["fluency"]
    train = fluency["lm"]["train"]
    lm, _ = planned_lm(fluency, 0)
    no_dropout = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    model = random_gpt2(fluency, lm, **no_dropout).to(need.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rows = torch.randint(1, lm.vocab, (train["batch_size"], lm.context), device=need.device)

    def step() -> None:
        loss = model(input_ids=rows, attention_mask=torch.ones_like(rows), labels=rows).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    began = time.perf_counter()
    step()
    steps = 1 if time.perf_counter() - began > SLOW_STEP_S else 2
    flops = 6.0 * lm.parameters * rows.numel()

    def run() -> dict[str, float]:
        began = time.perf_counter()
        for _ in range(steps):
            step()
        return {need.term.shape: steps * flops / (time.perf_counter() - began)}

    what = f"{steps} training step{'s' if steps > 1 else ''} of {rows.shape[0]} rows"
    return Trial(need.term.kind, "FLOP/s", what, run)


def load_trial(need: Need) -> Trial:
    """Bytes/s of loading the job's model as the scorer loads it."""
    import torch

    from gpuflow.fluency.ppl_model import load_causal_lm

    fluency = need.config["fluency"]
    lm, _ = planned_lm(fluency, 0)
    dtype = fluency["perplexity"]["dtype"]
    folder = tempfile.TemporaryDirectory()
    reference = model_folder(fluency, lm, Path(folder.name))
    size = lm.parameters * DTYPE_BYTES.get(dtype, 4)

    def run() -> dict[str, float]:
        began = time.perf_counter()
        load_causal_lm(reference, dtype, torch.device(need.device))
        return {need.term.shape: size / (time.perf_counter() - began)}

    run()
    return Trial(need.term.kind, "bytes/s", "loading the LM", run, folder.cleanup)


def toxicity_trial(need: Need) -> Trial | None:
    """Bytes/s of the profanity-check scorer on the job's texts (a Hugging Face classifier is
    not measured here)."""
    from gpuflow.fluency.toxicity import profanity_scorer

    fluency = need.config["fluency"]
    if fluency["toxicity"]["scorer"] != "profanity-check":
        return None
    texts = shard_texts(fluency, int(need.wildcards["shard"]))[0][:200]
    score, _ = profanity_scorer()
    score(texts[:8])
    return texts_trial(need, texts, f"scoring {len(texts)} texts", lambda: score(texts))


MEASURE = {
    "lm.forward.flop": forward_trial,
    "lm.train.flop": train_trial,
    "lm.load": load_trial,
    "toxicity.bytes": toxicity_trial,
}
