"""A toxicity score per text, with the scorer's name recorded beside every score.

- `profanity-check`: alt-profanity-check's offensive-language classifier (TF-IDF + calibrated
  linear SVM), shipped on PyPI. It detects offensive words, so it is a proxy for toxicity.
- `huggingface`: any local sequence-classification model; the score is the probability of the
  configured toxic label, batched on the job's first device.
"""

from __future__ import annotations

import argparse
import importlib.metadata
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from gpuflow.atomic import write_csv, write_json
from gpuflow.devices import run_record, worker_devices
from gpuflow.errors import ConfigError, GpuflowError
from gpuflow.fluency.texts import read_texts
from gpuflow.settings import family_settings

PROXY_NAME = "alt-profanity-check {version} (offensive-language proxy)"


def profanity_scores(texts: list[str]) -> tuple[np.ndarray, str]:
    """Probabilities of offensive language, and the scorer's name."""
    from profanity_check import predict_prob

    version = importlib.metadata.version("alt-profanity-check")
    scores = predict_prob(texts) if texts else np.zeros(0)
    return np.asarray(scores, dtype=np.float64), PROXY_NAME.format(version=version)


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


@torch.inference_mode()
def huggingface_scores(
    texts: list[str], model_ref: str, toxic_label: str, batch_size: int, device: torch.device
) -> tuple[np.ndarray, str]:
    """Probability of the toxic label under a local sequence-classification model."""
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
    order = np.argsort([-len(t) for t in texts], kind="stable")
    scores = np.zeros(len(texts), dtype=np.float64)
    for start in range(0, len(texts), batch_size):
        chosen = order[start : start + batch_size]
        batch = tokenizer(
            [texts[i] for i in chosen], padding=True, truncation=True, return_tensors="pt"
        ).to(device)
        logits = model(**batch).logits.float()
        probs = torch.sigmoid(logits) if multi_label else torch.softmax(logits, dim=-1)
        scores[chosen] = probs[:, index].double().cpu().numpy()
    return scores, f"{model_ref} (label {toxic_label!r})"


def main(args: argparse.Namespace) -> int:
    """`gpuflow toxicity`: score every text of a shard."""
    fluency = family_settings("fluency", args.settings, args.runtime)
    toxicity = fluency["toxicity"]
    texts = read_texts(args.texts)
    items = texts["text"].tolist()
    device = torch.device("cpu")
    if toxicity["scorer"] == "profanity-check":
        scores, name = profanity_scores(items)
    else:
        if not toxicity["model_path"]:
            raise ConfigError("fluency.toxicity.model_path", "required for the huggingface scorer")
        device = worker_devices(fluency["device"], cpu_workers=1)[0]
        scores, name = huggingface_scores(
            items, toxicity["model_path"], toxicity["toxic_label"], toxicity["batch_size"], device
        )
    write_csv(
        args.out,
        pd.DataFrame({"text_id": texts["text_id"], "toxicity": scores, "toxicity_scorer": name}),
    )
    write_json(
        Path(args.out).with_suffix(".run.json"),
        {**run_record([device]), "scorer": name, "texts": len(items)},
    )
    print(f"scored {len(items)} texts with {name}")
    return 0
