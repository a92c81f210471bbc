"""A toxicity score per text, with the scorer's name recorded beside every score."""

from __future__ import annotations

import argparse
import importlib.metadata
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from gpuflow.errors import ConfigError, GpuflowError
from gpuflow.fluency.ppl_model import model_identity
from gpuflow.fluency.texts import read_texts, texts_digest
from gpuflow.job import (
    ChunkedScores,
    Done,
    WorkerPool,
    make_fingerprint,
    run_record,
    worker_devices,
    write_csv,
    write_json,
)
from gpuflow.settings.blocks import family_settings, results_of

PROXY_NAME = "alt-profanity-check {version} (offensive-language proxy)"


def profanity_scorer() -> tuple[Callable[[list[str]], np.ndarray], str]:
    """The offensive-language probability of each text, and the scorer's name."""
    from profanity_check import predict_prob

    version = importlib.metadata.version("alt-profanity-check")

    def score(texts: list[str]) -> np.ndarray:
        return np.asarray(predict_prob(texts) if texts else np.zeros(0), dtype=np.float64)

    return score, PROXY_NAME.format(version=version)


def toxic_label_index(label2id: dict[str, int], toxic_label: str) -> int:
    """The class index of `toxic_label` (case-insensitive) in a model's label2id."""
    lowered = {name.lower(): index for name, index in label2id.items()}
    if toxic_label.lower() not in lowered:
        raise ConfigError(
            "fluency.toxicity.toxic_label",
            f"{toxic_label!r} is not a label of the model",
            f"one of {sorted(label2id)}",
        )
    return lowered[toxic_label.lower()]


def huggingface_scorer(
    model_ref: str, toxic_label: str, device: torch.device
) -> tuple[Callable[[list[str]], np.ndarray], str]:
    """Toxic-label probability per text under a local classifier, and the scorer's name."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(
            model_ref, local_files_only=True, trust_remote_code=False
        )
        model = AutoModelForSequenceClassification.from_pretrained(
            model_ref, local_files_only=True, trust_remote_code=False
        )
    except (OSError, ValueError) as error:
        raise GpuflowError(
            f"{model_ref}: cannot load a sequence-classification model ({error})"
        ) from None
    index = toxic_label_index(model.config.label2id, toxic_label)
    model.to(device).eval()
    multi_label = model.config.problem_type == "multi_label_classification"

    @torch.inference_mode()
    def score(texts: list[str]) -> np.ndarray:
        batch = tokenizer(texts, padding=True, truncation=True, return_tensors="pt").to(device)
        logits = model(**batch).logits.float()
        probs = torch.sigmoid(logits) if multi_label else torch.softmax(logits, dim=-1)
        return probs[:, index].double().cpu().numpy()

    return score, f"{model_ref} (label {toxic_label!r})"


def length_batches(texts: list[str], batch_size: int) -> list[np.ndarray]:
    """Text indices in batches of `batch_size`, longest texts first (little padding)."""
    order = np.argsort([-len(t) for t in texts], kind="stable")
    return [order[start : start + batch_size] for start in range(0, len(texts), batch_size)]


def main(args: argparse.Namespace) -> int:
    """`gpuflow toxicity`: score every text of a shard, saving the scores after each chunk."""
    fluency = family_settings("fluency", args.settings, args.runtime)
    toxicity = fluency["toxicity"]
    texts = read_texts(args.texts)
    items = texts["text"].tolist()
    device = torch.device("cpu")
    model: list[Any] = []
    if toxicity["scorer"] == "profanity-check":
        score, name = profanity_scorer()
        batches = [
            np.arange(start, min(start + toxicity["batch_size"], len(items)))
            for start in range(0, len(items), toxicity["batch_size"])
        ]
    else:
        if not toxicity["model_path"]:
            raise ConfigError("fluency.toxicity.model_path", "required for the huggingface scorer")
        device = worker_devices(fluency["device"], cpu_workers=1)[0]
        model = model_identity(toxicity["model_path"])
        score, name = huggingface_scorer(toxicity["model_path"], toxicity["toxic_label"], device)
        batches = length_batches(items, toxicity["batch_size"])
    state = make_fingerprint(
        settings=results_of("fluency", {"toxicity": toxicity}),
        identity={
            "texts": texts_digest(texts["text_id"], items),
            "scorer": name,
            "model": model,
            "device_type": device.type,
        },
    )
    scores = ChunkedScores(
        args.out,
        state,
        batches,
        [len(b) for b in batches],
        toxicity["chunk_texts"],
        {"toxicity": np.float64},
        "texts",
    )
    todo = scores.todo()

    def scored(done: Done) -> None:
        if done.error is not None:
            raise GpuflowError(f"{done.where}: {done.error}")
        scores.record(int(done.key), {"toxicity": done.result})

    pool = WorkerPool(lambda _: score, [str(device)], name="toxicity", item="batch", isolate=False)
    pool.run(
        {batch: [items[i] for i in batches[batch]] for batch in todo},
        scored,
        scores.stop_pending,
    )
    scores.stop_if_requested()
    write_csv(
        args.out,
        pd.DataFrame(
            {
                "text_id": texts["text_id"],
                "toxicity": scores.values["toxicity"],
                "toxicity_scorer": name,
            }
        ),
    )
    write_json(
        Path(args.out).with_suffix(".run.json"),
        {
            **run_record([device]),
            "scorer": name,
            "texts": len(items),
            **scores.record_fields("texts"),
        },
    )
    scores.job.release(outputs=[args.out, Path(args.out).with_suffix(".run.json")])
    print(f"scored {len(items)} texts with {name}")
    return 0
