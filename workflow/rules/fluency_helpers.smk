"""Helpers of the fluency-toxicity family: its settings, paths and input functions."""

from gpuflow.fluency.lm_shape import check_heads
from gpuflow.fluency.texts import check_group_columns

FLUENCY = config["fluency"]
FLUENCY_DIR = "results/fluency"
FLUENCY_SHARDS = [str(i) for i in range(FLUENCY["perplexity"]["shards"])]


def fluency_model():
    """The LM folder or cached id to score with: the user's, or the embedded one trained here."""
    return config["fluency"]["lm"]["path"] or "results/fluency/lm"


def fluency_embedded_lm():
    """The embedded LM folder as an input when the config trains one, else nothing.

    A user's model is a param, not an input, so a dry run works where the model is absent.
    """
    return [] if config["fluency"]["lm"]["path"] else ["results/fluency/lm"]


def fluency_model_param(wildcards, input):
    """The model `gpuflow perplexity` loads: the embedded LM input, or the configured model."""
    return input.embedded_lm or config["fluency"]["lm"]["path"]


def fluency_group_columns():
    """Columns the fluency statistics are grouped by."""
    if config["fluency"]["texts"]["source"] == "embedded":
        return ["condition", "source"]
    return config["fluency"]["texts"]["group_columns"]
