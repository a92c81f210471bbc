"""`gpuflow` steps of the fluency-toxicity family."""

from __future__ import annotations

import argparse

from gpuflow.registry import add_settings_arguments, lazy


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the fluency steps to the `gpuflow` parser."""
    texts = subparsers.add_parser("fluency-texts", help="the texts to score, as one CSV")
    texts.add_argument("--out", required=True, help="CSV: text_id, text, source, condition, ...")
    add_settings_arguments(texts, "fluency")
    texts.set_defaults(run=lazy("gpuflow.fluency.texts:main", outputs=("out",)))

    train = subparsers.add_parser("fluency-train-lm", help="train the embedded reference LM")
    train.add_argument("--exclude", required=True, help="texts CSV whose texts must not be seen")
    train.add_argument("--settings", default="{}", help="JSON of fluency.lm.train settings")
    train.add_argument("--out", required=True, help="model folder (save_pretrained)")
    train.set_defaults(run=lazy("gpuflow.fluency.train_lm:main", outputs=("out",)))

    split = subparsers.add_parser("fluency-split", help="deal texts into shards")
    split.add_argument("--texts", required=True)
    split.add_argument("--out", nargs="+", required=True, help="one CSV per shard")
    split.set_defaults(run=lazy("gpuflow.fluency.texts:split_main", outputs=("out",)))

    ppl = subparsers.add_parser("perplexity", help="exact batched perplexity of each text")
    ppl.add_argument("--texts", required=True, help="CSV with text_id and text")
    ppl.add_argument("--model", required=True, help="local model folder or cached model id")
    ppl.add_argument("--out", required=True, help="CSV: text_id, nll_sum, n_tokens, ppl")
    add_settings_arguments(ppl, "fluency")
    ppl.set_defaults(run=lazy("gpuflow.fluency.perplexity:main", outputs=("out",)))

    tox = subparsers.add_parser("toxicity", help="a toxicity score per text")
    tox.add_argument("--texts", required=True, help="CSV with text_id and text")
    tox.add_argument("--out", required=True, help="CSV: text_id, toxicity, toxicity_scorer")
    add_settings_arguments(tox, "fluency")
    tox.set_defaults(run=lazy("gpuflow.fluency.toxicity:main", outputs=("out",)))

    merge = subparsers.add_parser("fluency-merge", help="join texts, perplexity and toxicity")
    merge.add_argument("--texts", required=True)
    merge.add_argument("--perplexity", nargs="+", required=True)
    merge.add_argument("--toxicity", nargs="+", required=True)
    merge.add_argument("--group-columns", nargs="*", default=[])
    merge.add_argument("--model-name", required=True, help="the LM, as named in the summary")
    merge.add_argument("--out", required=True)
    merge.add_argument("--out-summary", required=True, help="JSON: corpus perplexity and counts")
    merge.set_defaults(run=lazy("gpuflow.fluency.merge:main", outputs=("out", "out_summary")))

    stats = subparsers.add_parser("fluency-stats", help="correlations with bootstrap CIs")
    stats.add_argument("--scores", required=True)
    stats.add_argument("--group-columns", nargs="*", default=[])
    stats.add_argument("--settings", default="{}", help="JSON of fluency.stats settings")
    for flag in ("--out-correlations", "--out-json", "--out-binned"):
        stats.add_argument(flag, required=True)
    stats_outputs = ("out_binned", "out_correlations", "out_json")
    stats.set_defaults(run=lazy("gpuflow.fluency.stats:main", outputs=stats_outputs))

    figures = subparsers.add_parser("fluency-figures", help="the fluency-toxicity figures")
    figures.add_argument("--scores", required=True)
    figures.add_argument("--binned", required=True)
    figures.add_argument("--group-columns", nargs="*", default=[])
    for flag in ("--out-scatter", "--out-binned", "--out-by-group"):
        figures.add_argument(flag, required=True)
    figures_outputs = ("out_binned", "out_by_group", "out_scatter")
    figures.set_defaults(run=lazy("gpuflow.fluency.figures:main", outputs=figures_outputs))

    report = subparsers.add_parser("fluency-report", help="the markdown summary")
    for flag in ("--summary", "--correlations", "--binned", "--out"):
        report.add_argument(flag, required=True)
    report.set_defaults(run=lazy("gpuflow.fluency.report:main", outputs=("out",)))
