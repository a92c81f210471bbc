"""Helpers of the toy family: its folder, settings and config check."""

TOY = config["toy"]
TOY_DIR = "results/toy"


def toy_check():
    """Stop before any job when the log would never say a word."""
    if TOY["log_every"] > TOY["units"]:
        raise WorkflowError(
            f"config key 'toy.log_every': {TOY['log_every']} exceeds toy.units"
            f" (expected at most {TOY['units']})"
        )
