"""A BPE tokenizer trained offline on the training split, and both splits encoded once."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

from gpuflow.errors import DataError
from gpuflow.job import atomic_path, write_json
from gpuflow.settings.blocks import configuration, family_settings

PAD, UNK = "[PAD]", "[UNK]"
PAD_ID, UNK_ID = 0, 1


def train_tokenizer(texts: list[str], settings: dict[str, Any]) -> Tokenizer:
    """A BPE tokenizer learnt from `texts` ([PAD] = 0, [UNK] = 1) as `tokenizer` settings ask."""
    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    steps = [normalizers.NFKC()] + ([normalizers.Lowercase()] if settings["lowercase"] else [])
    tokenizer.normalizer = normalizers.Sequence(steps)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation()]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=settings["vocab_size"],
        min_frequency=settings["min_frequency"],
        special_tokens=[PAD, UNK],
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tokenizer


def encode(
    tokenizer: Tokenizer, texts: list[str], max_len: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """(ids, offsets, number of truncated texts); empty texts become one [UNK] token."""
    pieces, truncated = [], 0
    for encoding in tokenizer.encode_batch(texts, add_special_tokens=False):
        ids = encoding.ids or [UNK_ID]
        truncated += len(ids) > max_len
        pieces.append(np.asarray(ids[:max_len], dtype=np.int32))
    lengths = np.array([len(p) for p in pieces], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return np.concatenate(pieces), offsets, truncated


def read_split(path: str | Path) -> pd.DataFrame:
    """A split CSV written by `scaling-data` (text, label)."""
    frame = pd.read_csv(path, keep_default_na=False)
    if list(frame.columns[:2]) != ["text", "label"]:
        raise DataError(path, f"columns {list(frame.columns)}", expected="text,label")
    return frame


def save_encoded(path: str | Path, ids: np.ndarray, offsets: np.ndarray, labels: Any) -> None:
    """Write one encoded split atomically."""
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        np.savez(handle, ids=ids, offsets=offsets, labels=np.asarray(labels, dtype=np.int64))


def main(args: argparse.Namespace) -> None:
    """`gpuflow scaling-tokenize`: learn the tokenizer on the training split, encode both."""
    chosen = configuration(family_settings("scaling", args.settings), args.name)
    max_len = chosen["model"]["max_seq_len"]
    train, val = read_split(args.train), read_split(args.val)
    tokenizer = train_tokenizer(train["text"].tolist(), chosen["tokenizer"])
    stats: dict[str, Any] = {"vocab_size": tokenizer.get_vocab_size(), "max_len": max_len}
    for name, frame, out in (("train", train, args.out_train), ("val", val, args.out_val)):
        ids, offsets, truncated = encode(tokenizer, frame["text"].tolist(), max_len)
        save_encoded(out, ids, offsets, frame["label"].to_numpy())
        lengths = np.diff(offsets)
        stats[name] = {
            "texts": len(frame),
            "tokens": int(lengths.sum()),
            "mean_tokens": float(lengths.mean()),
            "truncated_fraction": truncated / len(frame),
        }
    with atomic_path(args.out_tokenizer) as tmp:
        tokenizer.save(str(tmp))
    write_json(args.out_stats, stats)
    print(json.dumps(stats))
