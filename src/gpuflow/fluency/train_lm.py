"""Train the embedded reference LM: a byte-level BPE tokenizer and a small GPT-2 on review text."""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

from gpuflow.fluency.lm_shape import check_heads
from gpuflow.fluency.lm_tokens import END_OF_TEXT, train_bpe, training_texts
from gpuflow.fluency.texts import read_texts
from gpuflow.job import atomic_path, current
from gpuflow.settings.blocks import block_settings

VALIDATION_SHARE = 0.05
LOG_EVERY = 50  # steps between two points of the training loss (printed and tracked)


def lm_settings(text: str) -> dict[str, Any]:
    """The `fluency.lm.train` block from its JSON (defaults: the schema); bad JSON, values, keys
    and n_head are errors naming the key."""
    settings = block_settings("fluency", ("lm", "train"), text)
    check_heads(settings)
    return settings


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with GPT-2's end-of-text token as BOS, EOS and padding."""
    return PreTrainedTokenizerFast(
        tokenizer_object=train_bpe(texts, vocab_size),
        bos_token=END_OF_TEXT,
        eos_token=END_OF_TEXT,
        pad_token=END_OF_TEXT,
        unk_token=END_OF_TEXT,
    )


def gpt2_config(tokenizer: PreTrainedTokenizerFast, **shape: Any) -> GPT2Config:
    """A GPT-2 of `shape` (GPT2Config keys) for `tokenizer`, its end-of-text token as BOS, EOS and
    padding."""
    return GPT2Config(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **shape,
    )


def save_untrained_lm(
    folder: Path,
    texts: list[str],
    vocab_size: int,
    n_positions: int,
    n_embd: int,
    n_layer: int,
    n_head: int,
    seed: int = 0,
    initializer_range: float = 0.02,
) -> Path:
    """A randomly initialised GPT-2 and a BPE tokenizer trained on `texts`, saved to `folder`."""
    tokenizer = train_tokenizer(texts, vocab_size)
    torch.manual_seed(seed)
    config = gpt2_config(
        tokenizer,
        n_positions=n_positions,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        initializer_range=initializer_range,
    )
    with atomic_path(folder) as tmp:
        GPT2LMHeadModel(config).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return folder


def token_blocks(texts: list[str], tokenizer: PreTrainedTokenizerFast, block: int) -> torch.Tensor:
    """All texts as one stream (each preceded by end-of-text), cut into rows of `block` tokens."""
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
    stream = [token for ids in encoded for token in (tokenizer.eos_token_id, *ids)]
    usable = len(stream) // block * block
    return torch.tensor(stream[:usable], dtype=torch.long).view(-1, block)


def learning_rate(step: int, settings: Mapping[str, Any]) -> float:
    """Linear warm-up over 5% of the steps, then cosine decay to a tenth of the peak."""
    warmup = max(1, settings["steps"] // 20)
    if step < warmup:
        return settings["learning_rate"] * (step + 1) / warmup
    progress = (step - warmup) / max(1, settings["steps"] - warmup)
    return settings["learning_rate"] * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def validation_perplexity(model: GPT2LMHeadModel, blocks: torch.Tensor, batch: int) -> float:
    """Token-level perplexity of `blocks` under `model`."""
    model.eval()
    total, count = 0.0, 0
    for start in range(0, len(blocks), batch):
        rows = blocks[start : start + batch]
        loss = model(input_ids=rows, attention_mask=torch.ones_like(rows), labels=rows).loss
        n = rows.numel() - len(rows)
        total, count = total + loss.item() * n, count + n
    model.train()
    return math.exp(total / count)


def build_lm(
    tokenizer: PreTrainedTokenizerFast, settings: Mapping[str, Any]
) -> tuple[GPT2LMHeadModel, torch.optim.AdamW]:
    """The untrained embedded LM of `settings`' shape (no dropout) and its optimizer."""
    shape = {key: settings[key] for key in ("n_positions", "n_embd", "n_layer", "n_head")}
    config = gpt2_config(tokenizer, **shape, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=settings["learning_rate"], weight_decay=0.01
    )
    return model, optimizer


def train_step(
    model: GPT2LMHeadModel, optimizer: torch.optim.Optimizer, rows: torch.Tensor, lr: float
) -> torch.Tensor:
    """One step on `rows` at learning rate `lr`, gradients clipped to norm 1; the loss."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss = model(input_ids=rows, attention_mask=torch.ones_like(rows), labels=rows).loss
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss


def train_lm(excluded: list[str], settings: Mapping[str, Any], out: Path) -> dict[str, Any]:
    """Train tokenizer and model, save both to `out` atomically; return the training summary."""
    torch.manual_seed(settings["seed"])
    texts = training_texts(excluded, settings["n_texts"], settings["seed"])
    tokenizer = train_tokenizer(texts, settings["vocab_size"])
    blocks = token_blocks(texts, tokenizer, settings["n_positions"])
    order = torch.randperm(len(blocks), generator=torch.Generator().manual_seed(settings["seed"]))
    n_valid = max(1, int(len(blocks) * VALIDATION_SHARE))
    valid, train = blocks[order[:n_valid]], blocks[order[n_valid:]]
    model, optimizer = build_lm(tokenizer, settings)
    sampler = torch.Generator().manual_seed(settings["seed"] + 1)
    tracked = current([out]).track(settings)
    started = time.perf_counter()
    for step in range(settings["steps"]):
        rows = train[torch.randint(len(train), (settings["batch_size"],), generator=sampler)]
        loss = train_step(model, optimizer, rows, learning_rate(step, settings))
        if step % LOG_EVERY == 0 or step == settings["steps"] - 1:
            print(f"step {step:5d}  train loss {loss.item():.3f}", flush=True)
            tracked.log(step + 1, {"train_loss": loss.item()})
    summary = {
        "settings": dict(settings),
        "training_texts": len(texts),
        "training_tokens": int(train.numel()),
        "validation_tokens": int(valid.numel()),
        "validation_perplexity": validation_perplexity(model, valid, settings["batch_size"]),
        "train_seconds": round(time.perf_counter() - started, 2),
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    with atomic_path(out) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "training_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    final = ("validation_perplexity", "train_seconds", "parameters")
    tracked.final(settings["steps"], {key: summary[key] for key in final})
    return summary


def main(args: argparse.Namespace) -> int:
    """`gpuflow fluency-train-lm`: train the embedded LM on reviews the scoring never sees."""
    settings = lm_settings(args.settings)
    scored = read_texts(args.exclude)
    excluded = scored.loc[scored.get("condition", "") != "shuffled", "text"].tolist()
    summary = train_lm(excluded, settings, Path(args.out))
    print(json.dumps(summary, indent=2))
    return 0
