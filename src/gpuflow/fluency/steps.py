"""`gpuflow` steps of the fluency-toxicity family."""

from __future__ import annotations

import argparse

from gpuflow.cli import lazy


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the fluency steps to the `gpuflow` parser."""
    texts = subparsers.add_parser("fluency-texts", help="the texts to score, as one CSV")
    texts.add_argument("--out", required=True, help="CSV: text_id, text, source, condition, ...")
    texts.add_argument("--n-texts", type=int, default=400, help="embedded: original texts")
    texts.add_argument("--corpus", nargs="+", default=["imdb", "rotten_tomatoes"])
    texts.add_argument("--max-words", type=int, default=400, help="embedded: words kept per text")
    texts.add_argument("--min-words", type=int, default=8, help="embedded: shortest text drawn")
    texts.add_argument("--seed", type=int, default=0)
    texts.add_argument("--shuffled-twins", action="store_true", help="add word-shuffled twins")
    texts.add_argument("--files", nargs="+", help="your own CSV/TSV/JSONL files instead")
    texts.add_argument("--text-column", default="text")
    texts.add_argument("--id-column", default=None)
    texts.add_argument("--group-columns", nargs="*", default=[])
    texts.set_defaults(run=lazy("gpuflow.fluency.texts:main"))

    train = subparsers.add_parser("fluency-train-lm", help="train the embedded reference LM")
    train.add_argument("--exclude", required=True, help="texts CSV whose texts must not be seen")
    train.add_argument("--settings", default="{}", help="JSON of fluency.lm.train settings")
    train.add_argument("--out", required=True, help="model folder (save_pretrained)")
    train.set_defaults(run=lazy("gpuflow.fluency.train_lm:main"))

    split = subparsers.add_parser("fluency-split", help="deal texts into shards")
    split.add_argument("--texts", required=True)
    split.add_argument("--out", nargs="+", required=True, help="one CSV per shard")
    split.set_defaults(run=lazy("gpuflow.fluency.texts:split_main"))

    ppl = subparsers.add_parser("perplexity", help="exact batched perplexity of each text")
    ppl.add_argument("--texts", required=True, help="CSV with text_id and text")
    ppl.add_argument("--model", required=True, help="local model folder or cached model id")
    ppl.add_argument("--out", required=True, help="CSV: text_id, nll_sum, n_tokens, ppl")
    ppl.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    ppl.add_argument("--cpu-workers", type=int, default=1)
    ppl.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    ppl.add_argument("--token-budget", type=int, default=8192, help="padded tokens per batch")
    ppl.add_argument("--stride", type=int, default=None, help="window stride (default ctx/2)")
    ppl.add_argument(
        "--placement",
        default="auto",
        choices=["auto", "replicate", "shard"],
        help="a model copy per GPU, one copy across the GPUs, or auto (see fluency.placement)",
    )
    ppl.add_argument("--trust-remote-code", action="store_true")
    ppl.set_defaults(run=lazy("gpuflow.fluency.perplexity:main"))

    tox = subparsers.add_parser("toxicity", help="a toxicity score per text")
    tox.add_argument("--texts", required=True, help="CSV with text_id and text")
    tox.add_argument("--out", required=True, help="CSV: text_id, toxicity, toxicity_scorer")
    tox.add_argument(
        "--scorer", default="profanity-check", choices=["profanity-check", "huggingface"]
    )
    tox.add_argument("--model", default=None, help="huggingface: model folder or cached id")
    tox.add_argument("--toxic-label", default="toxic")
    tox.add_argument("--batch-size", type=int, default=32)
    tox.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    tox.set_defaults(run=lazy("gpuflow.fluency.toxicity:main"))

    merge = subparsers.add_parser("fluency-merge", help="join texts, perplexity and toxicity")
    merge.add_argument("--texts", required=True)
    merge.add_argument("--perplexity", nargs="+", required=True)
    merge.add_argument("--toxicity", nargs="+", required=True)
    merge.add_argument("--group-columns", nargs="*", default=[])
    merge.add_argument("--model-name", required=True, help="the LM, as named in the summary")
    merge.add_argument("--out", required=True)
    merge.add_argument("--summary", required=True, help="JSON: corpus perplexity and counts")
    merge.set_defaults(run=lazy("gpuflow.fluency.merge:main"))

    stats = subparsers.add_parser("fluency-stats", help="correlations with bootstrap CIs")
    stats.add_argument("--scores", required=True)
    stats.add_argument("--group-columns", nargs="*", default=[])
    stats.add_argument("--settings", default="{}", help="JSON of fluency.stats settings")
    stats.add_argument("--out-correlations", required=True)
    stats.add_argument("--out-json", required=True)
    stats.add_argument("--out-binned", required=True)
    stats.set_defaults(run=lazy("gpuflow.fluency.stats:main"))

    figures = subparsers.add_parser("fluency-figures", help="the fluency-toxicity figures")
    figures.add_argument("--scores", required=True)
    figures.add_argument("--binned", required=True)
    figures.add_argument("--group-columns", nargs="*", default=[])
    figures.add_argument("--out-scatter", required=True)
    figures.add_argument("--out-binned", required=True)
    figures.add_argument("--out-by-group", required=True)
    figures.set_defaults(run=lazy("gpuflow.fluency.figures:main"))

    report = subparsers.add_parser("fluency-report", help="the markdown summary")
    report.add_argument("--summary", required=True)
    report.add_argument("--correlations", required=True)
    report.add_argument("--binned", required=True)
    report.add_argument("--out", required=True)
    report.set_defaults(run=lazy("gpuflow.fluency.report:main"))
