"""`gpuflow perplexity`: exact batched perplexity of each text under a local causal LM."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from gpuflow.errors import ConfigError, DataError
from gpuflow.fluency.merge import PERPLEXITY_COLUMNS, corpus_perplexity
from gpuflow.fluency.placement import choose_placement, sized_token_budget
from gpuflow.fluency.ppl_model import (
    check_dtype,
    load_config,
    load_tokenizer,
    model_context,
    model_identity,
    start_token_id,
)
from gpuflow.fluency.ppl_scoring import Forward, SegmentScores
from gpuflow.fluency.ppl_segments import make_segments, plan_batches, sort_longest_first
from gpuflow.fluency.ppl_workers import WorkerJob, score_batches, worker_threads
from gpuflow.fluency.texts import read_texts, texts_digest
from gpuflow.job import (
    ChunkedScores,
    current,
    make_fingerprint,
    run_record,
    worker_devices,
    write_csv,
    write_json,
)
from gpuflow.settings.blocks import family_settings, results_of


def scoring_settings(**values: Any) -> dict[str, Any]:
    """A `fluency.perplexity` block for `score_token_ids` outside a step, over the defaults."""
    return {**family_settings("fluency")["perplexity"], "placement": "replicate", **values}


def tokenize(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text: no special tokens, no padding, no truncation."""
    if not texts:
        return []
    return tokenizer(list(texts), add_special_tokens=False, verbose=False)["input_ids"]


def check_stride(stride: int | None, context: int) -> int:
    """The window stride: `stride`, or half the context when None; it must be below it."""
    chosen = context // 2 if stride is None else stride
    if not 1 <= chosen < context:
        raise ConfigError(
            "fluency.perplexity.stride",
            f"stride {chosen} does not fit the model context of {context} tokens",
            f"an integer from 1 to {context - 1}, or null for {context // 2}",
        )
    return chosen


def score_token_ids(
    token_ids: Sequence[Sequence[int]],
    *,
    model: str,
    bos_id: int,
    context: int,
    stride: int,
    devices: Sequence[torch.device],
    settings: Mapping[str, Any],
    trust_remote_code: bool = False,
    wrap_forward: Callable[[Forward], Forward] | None = None,
    out: str | Path | None = None,
    state_fingerprint: str = "",
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Per-text NLL sums (float64) and token counts, in input order, plus batching stats."""
    token_budget = settings["token_budget"]
    if token_budget < 1:
        raise ConfigError("fluency.perplexity.token_budget", f"got {token_budget}", ">= 1")
    ordered = sort_longest_first(make_segments(token_ids, bos_id, context, stride))
    batches = plan_batches(ordered, token_budget)
    sharded = settings["placement"] == "shard"
    workers = [str(d) for d in (devices[:1] if sharded else devices)]
    job = WorkerJob(
        model=model,
        trust_remote_code=trust_remote_code,
        threads=worker_threads(len(workers)),
        settings=dict(settings),
        shard_over=tuple(str(d) for d in devices) if sharded else (),
    )
    scores = ChunkedScores(
        out,
        state_fingerprint,
        [np.arange(b.start, b.stop) for b in batches],
        [sum(s.n_targets for s in ordered[b.start : b.stop]) for b in batches],
        settings["chunk_tokens"],
        {"nll": np.float64, "n_tokens": np.int64},
        "tokens",
    )
    todo = scores.todo()
    outcome = {"oom_splits": 0, "final_token_budget": token_budget}
    bar = tqdm(
        total=int(scores.weights.sum()),
        initial=scores.weight_done(),
        desc=f"perplexity ({len(workers)} worker(s))",
        unit="tok",
        unit_scale=True,
        mininterval=2.0,
        file=sys.stderr,
    )

    seconds: dict[int, float] = {}  # each worker's scoring time, model loading excluded
    loading: dict[int, float] = {}  # each worker's model loading (and compiling) time

    def on_scored(batch: int, result: SegmentScores, worker: int) -> None:
        scores.record(batch, {"nll": result.nll, "n_tokens": result.n_tokens})
        outcome["oom_splits"] += result.oom_splits
        outcome["final_token_budget"] = min(outcome["final_token_budget"], result.token_budget)
        seconds[worker] = seconds.get(worker, 0.0) + result.seconds
        loading[worker] = loading.get(worker, 0.0) + result.load_seconds
        bar.update(int(result.n_tokens.sum()))

    with bar:
        deaths = score_batches(
            job,
            workers,
            [ordered[b.start : b.stop] for b in batches],
            todo,
            on_scored,
            scores.stop_pending,
            lambda line: tqdm.write(line, file=sys.stderr),
            wrap_forward,
        )
    scores.stop_if_requested()
    text_index = np.array([s.text for s in ordered], dtype=np.int64)
    nll = np.bincount(text_index, scores.values["nll"], len(token_ids))  # summed in order
    n_tokens = np.bincount(text_index, scores.values["n_tokens"], len(token_ids)).astype(np.int64)
    stats = {
        "segments": len(ordered),
        "ids": sum(len(segment.ids) for segment in ordered),  # through the model, context too
        **outcome,
        "scoring_seconds": round(max(seconds.values(), default=0.0), 3),
        "load_seconds": round(max(loading.values(), default=0.0), 3),
        "worker_deaths": deaths,
        **scores.record_fields("tokens"),
    }
    return nll, n_tokens, stats


def perplexity_frame(
    text_ids: Sequence[str], nll: np.ndarray, n_tokens: np.ndarray
) -> pd.DataFrame:
    """The output table: text_id, nll_sum, n_tokens, ppl = exp(nll_sum / n_tokens) (NaN if 0)."""
    return pd.DataFrame(
        {
            "text_id": list(text_ids),
            "nll_sum": nll,
            "n_tokens": n_tokens,
            "ppl": np.where(n_tokens > 0, np.exp(nll / np.maximum(n_tokens, 1)), np.nan),
        },
        columns=list(PERPLEXITY_COLUMNS),
    )


def reject_empty(
    token_ids: Sequence[Sequence[int]], text_ids: Sequence[str], path: str | Path
) -> None:
    """A text without tokens has no perplexity: name the first one (row counted from 1)."""
    for row, (text_id, tokens) in enumerate(zip(text_ids, token_ids, strict=True), start=1):
        if not tokens:
            raise DataError(path, f"text_id {text_id!r} has no tokens to score (empty text)", row)


def main(args: argparse.Namespace) -> int:
    """Score every text of `args.texts` and write text_id, nll_sum, n_tokens, ppl."""
    started = time.perf_counter()
    fluency = family_settings("fluency", args.settings, args.runtime)
    perplexity, trust_remote_code = fluency["perplexity"], fluency["lm"]["trust_remote_code"]
    dtype = perplexity["dtype"]
    devices = worker_devices(fluency["device"], fluency["cpu_workers"])
    check_dtype(dtype, devices)
    frame = read_texts(args.texts).loc[:, ["text_id", "text"]]
    config = load_config(args.model, trust_remote_code)
    context = model_context(config, args.model)
    stride = check_stride(perplexity["stride"], context)
    tokenizer = load_tokenizer(args.model, trust_remote_code)
    bos_id = start_token_id(tokenizer, args.model)
    placement, placement_reason = choose_placement(
        perplexity["placement"], config, devices, dtype, perplexity["token_budget"]
    )
    token_budget, budget_reason = sized_token_budget(
        perplexity["token_budget"],
        perplexity["fill_free_memory"],
        config,
        devices,
        dtype,
        placement,
    )
    token_ids = tokenize(tokenizer, frame["text"].tolist())
    reject_empty(token_ids, frame["text_id"], args.texts)
    print(
        f"scoring {len(frame)} texts with {args.model} (context {context}, stride {stride}, "
        f"{dtype}, {placement}) on {', '.join(map(str, devices))}",
        file=sys.stderr,
    )
    stats: dict[str, Any] = {"segments": 0, "oom_splits": 0, "final_token_budget": 0}
    nll, n_tokens = np.zeros(0), np.zeros(0, dtype=np.int64)
    if token_ids:
        state_fingerprint = make_fingerprint(
            settings=results_of("fluency", {"perplexity": perplexity}),
            identity={
                "texts": texts_digest(frame["text_id"], frame["text"]),
                "model": model_identity(args.model),
                "trust_remote_code": trust_remote_code,
                "context": context,
                "stride": stride,
                "bos": bos_id,
                "device_type": devices[0].type,
            },
        )
        nll, n_tokens, stats = score_token_ids(
            token_ids,
            model=args.model,
            bos_id=bos_id,
            context=context,
            stride=stride,
            devices=devices,
            settings={**perplexity, "token_budget": token_budget, "placement": placement},
            trust_remote_code=trust_remote_code,
            out=args.out,
            state_fingerprint=state_fingerprint,
        )
    write_csv(args.out, perplexity_frame(frame["text_id"], nll, n_tokens))
    seconds = time.perf_counter() - started
    record = {
        **run_record(list(devices)),
        "model": args.model,
        "dtype": dtype,
        "context": context,
        "stride": stride,
        "texts": len(frame),
        "tokens": int(n_tokens.sum()),
        "corpus_perplexity": corpus_perplexity(nll, n_tokens) if len(frame) else None,
        "seconds": round(seconds, 3),
        "token_budget": token_budget,
        "token_budget_reason": budget_reason,
        "attn_implementation": perplexity["attn_implementation"],
        "compile": perplexity["compile"],
        "placement": placement,
        "placement_reason": placement_reason,
        **stats,
    }
    write_json(Path(args.out).with_suffix(".run.json"), record)
    current([args.out]).release(outputs=[args.out, Path(args.out).with_suffix(".run.json")])
    print(json.dumps(record), file=sys.stderr)
    return 0
